package redispeers

import (
	"context"
	"errors"
	"fmt"

	"github.com/redis/go-redis/v9"

	"github.com/stockctl/stockctl/cmd/stockctl/bench"
	"github.com/stockctl/stockctl/coordinator"
)

// Lua is the common seckill way: the whole stock in one Redis key, taken
// by a Lua script that decrements it only if it holds enough, and records
// the order in the same script (so a retry under the same order ID is
// answered, not deducted twice). Redis runs scripts one at a time: no lock,
// no business step, no ideal.
func Lua(addr string) bench.Spec {
	return bench.Spec{Name: "redis-lua", Title: "Redis Lua decrement-if-enough on one key", OneKey: true,
		New: func() bench.Strategy { return &luaStrategy{addr: addr} }}
}

// takeScript: KEYS[1] the stock, KEYS[2] the order record, ARGV[1] the
// quantity. Returns 1 taken, 2 already taken by this order, 0 not enough.
var takeScript = redis.NewScript(`
if redis.call('EXISTS', KEYS[2]) == 1 then return 2 end
local have = tonumber(redis.call('GET', KEYS[1]))
if have == nil or have < tonumber(ARGV[1]) then return 0 end
redis.call('DECRBY', KEYS[1], ARGV[1])
redis.call('SET', KEYS[2], ARGV[1])
return 1
`)

type luaStrategy struct {
	addr string
	p    bench.Params
	cs   []*redis.Client
}

func (s *luaStrategy) stock() string          { return s.p.Prefix + "stock:all" }
func (s *luaStrategy) record(o string) string { return s.p.Prefix + "order:" + o }

func (s *luaStrategy) Setup(ctx context.Context, p bench.Params) error {
	s.p = p
	s.cs = clients(s.addr, p)
	if err := s.cs[0].Set(ctx, s.stock(), p.Units, 0).Err(); err != nil {
		return fmt.Errorf("put the stock: %w", err)
	}
	return takeScript.Load(ctx, s.cs[0]).Err()
}

func (s *luaStrategy) Buy(ctx context.Context, buyer int, order string, qty int64, routeKey string) (bool, error) {
	n, err := takeScript.Run(ctx, s.cs[s.p.Process(buyer)], []string{s.stock(), s.record(order)}, qty).Int()
	switch {
	case err != nil:
		return false, fmt.Errorf("take %d: %w", qty, err)
	case n == 0:
		return false, fmt.Errorf("take %d: %w", qty, coordinator.ErrInsufficientStock)
	}
	return n == 2, nil
}

func (s *luaStrategy) Verify(ctx context.Context) (bench.Books, error) {
	b := bench.Books{Stock: s.p.Units}
	return b, readBooks(ctx, s.cs[0], s.stock(), s.p.Prefix+"order:*", &b)
}

func (s *luaStrategy) Teardown(ctx context.Context) error {
	if len(s.cs) == 0 {
		return nil
	}
	err := deleteMatching(ctx, s.cs[0], s.p.Prefix+"*")
	return errors.Join(err, closeAll(s.cs))
}
