package redispeers

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/stockctl/stockctl/cmd/stockctl/bench"
)

// LuaSale is the common seckill way in a sale shape: each SKU's stock in
// one Redis key, taken by the same "decrement if enough" Lua script as Lua
// (which records the order, so a retry is answered, not deducted twice),
// and given back by a script that marks the order released.
func LuaSale(addr string) bench.SaleSpec {
	return bench.SaleSpec{Name: "redis-lua", Title: "Redis Lua decrement-if-enough, one key per SKU",
		New: func() bench.SaleStrategy { return &luaSale{addr: addr} }}
}

// SaleSpecs returns the Redis sale strategies against addr.
func SaleSpecs(addr string) ([]bench.SaleSpec, error) {
	if _, err := Specs(addr); err != nil { // checks that Redis answers
		return nil, err
	}
	return []bench.SaleSpec{LuaSale(addr)}, nil
}

// releaseScript: KEYS[1] the stock, KEYS[2] the order record. Gives the
// order's units back once: the record's value becomes negative (released).
// Returns 1 released, 2 already released, 0 no such order.
var releaseScript = redis.NewScript(`
local q = tonumber(redis.call('GET', KEYS[2]))
if q == nil then return 0 end
if q < 0 then return 2 end
redis.call('INCRBY', KEYS[1], q)
redis.call('SET', KEYS[2], -q)
return 1
`)

// cartScript: KEYS[1..n] the stocks, KEYS[n+1..2n] the lines' order
// records, ARGV[1] the quantity of every line. Takes every line or none:
// returns 1 taken, 2 already taken by this order, -i (i from 1) when line i
// had not enough (nothing taken). All keys in one script, as a Redis
// cluster allows only within one hash slot.
var cartScript = redis.NewScript(`
local n = #KEYS / 2
if redis.call('EXISTS', KEYS[n+1]) == 1 then return 2 end
local q = tonumber(ARGV[1])
for i = 1, n do
  local have = tonumber(redis.call('GET', KEYS[i]))
  if have == nil or have < q then return -i end
end
for i = 1, n do
  redis.call('DECRBY', KEYS[i], q)
  redis.call('SET', KEYS[n+i], q)
end
return 1
`)

type luaSale struct {
	addr string
	p    bench.SaleParams
	cs   []*redis.Client
}

func (s *luaSale) stock(sku int) string { return s.p.Prefix + "stock:" + bench.SKUName(sku) }
func (s *luaSale) record(sku int, o string) string {
	return s.p.Prefix + "order:" + bench.SKUName(sku) + ":" + o
}

func (s *luaSale) Setup(ctx context.Context, p bench.SaleParams) error {
	s.p = p
	for range p.Processes {
		s.cs = append(s.cs, redis.NewClient(&redis.Options{Addr: s.addr, DialTimeout: dialTimeout, PoolSize: bench.DefaultSaleBuyers/p.Processes + 4}))
	}
	for i := range p.Shape.SKUs {
		if err := s.cs[0].Set(ctx, s.stock(i), p.Shape.Stock, 0).Err(); err != nil {
			return fmt.Errorf("put the stock: %w", err)
		}
	}
	if err := takeScript.Load(ctx, s.cs[0]).Err(); err != nil {
		return err
	}
	if err := cartScript.Load(ctx, s.cs[0]).Err(); err != nil {
		return err
	}
	return releaseScript.Load(ctx, s.cs[0]).Err()
}

func (s *luaSale) Order(ctx context.Context, process, sku int, order string) (bench.OrderOutcome, error) {
	n, err := takeScript.Run(ctx, s.cs[process], []string{s.stock(sku), s.record(sku, order)}, 1).Int()
	if err != nil {
		return bench.OrderOutcome{}, fmt.Errorf("take 1: %w", err)
	}
	return bench.OrderOutcome{Served: n != 0}, nil
}

// OrderCart takes 1 unit of each of skus in one script (cartScript).
func (s *luaSale) OrderCart(ctx context.Context, process int, skus []int, order string) (bench.OrderOutcome, error) {
	keys := make([]string, 2*len(skus))
	for i, k := range skus {
		keys[i], keys[len(skus)+i] = s.stock(k), s.record(k, order)
	}
	n, err := cartScript.Run(ctx, s.cs[process], keys, 1).Int()
	if err != nil {
		return bench.OrderOutcome{}, fmt.Errorf("take a cart: %w", err)
	}
	if n < 0 {
		return bench.OrderOutcome{Line: -n - 1}, nil
	}
	return bench.OrderOutcome{Served: true}, nil
}

func (s *luaSale) Release(ctx context.Context, process, sku int, order string) error {
	n, err := releaseScript.Run(ctx, s.cs[process], []string{s.stock(sku), s.record(sku, order)}).Int()
	switch {
	case err != nil:
		return fmt.Errorf("release: %w", err)
	case n == 0:
		return fmt.Errorf("release %s: no such order", order)
	}
	return nil
}

func (s *luaSale) Verify(ctx context.Context) (bench.SaleBooks, error) {
	n := s.p.Shape.SKUs
	b := bench.SaleBooks{Sold: make([]int64, n), Stock: make([]int64, n)}
	remaining := make([]int64, n)
	index := map[string]int{}
	for i := range n {
		index[bench.SKUName(i)] = i
		b.Stock[i] = s.p.Shape.Stock
	}
	// One scan of each pattern (a SCAN walks the whole keyspace): every
	// stock key, then every order record, each told apart by its SKU.
	stockPfx, orderPfx := s.p.Prefix+"stock:", s.p.Prefix+"order:"
	if err := scanValues(ctx, s.cs[0], stockPfx+"*", func(k string, v int64) {
		if i, ok := index[strings.TrimPrefix(k, stockPfx)]; ok {
			remaining[i] = v
		}
	}); err != nil {
		return b, err
	}
	if err := scanValues(ctx, s.cs[0], orderPfx+"*", func(k string, v int64) {
		sku, _, _ := strings.Cut(strings.TrimPrefix(k, orderPfx), ":")
		if i, ok := index[sku]; ok && v > 0 {
			b.Sold[i] += v
		}
	}); err != nil {
		return b, err
	}
	for i := range n {
		if remaining[i]+b.Sold[i] != b.Stock[i] {
			b.Problems = append(b.Problems, fmt.Sprintf("%s: %d left + %d held != %d", bench.SKUName(i), remaining[i], b.Sold[i], b.Stock[i]))
		}
	}
	return b, nil
}

func (s *luaSale) Teardown(ctx context.Context) error {
	if len(s.cs) == 0 {
		return nil
	}
	err := deleteMatching(ctx, s.cs[0], s.p.Prefix+"*")
	return errors.Join(err, closeAll(s.cs))
}
