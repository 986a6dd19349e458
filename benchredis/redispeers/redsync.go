package redispeers

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/go-redsync/redsync/v4"
	goredis "github.com/go-redsync/redsync/v4/redis/goredis/v9"
	"github.com/redis/go-redis/v9"

	"github.com/stockctl/stockctl/cmd/stockctl/bench"
	"github.com/stockctl/stockctl/coordinator"
	"github.com/stockctl/stockctl/segments"
)

// unlockTimeout bounds an unlock, which runs even after the order's ctx
// ended.
const unlockTimeout = 5 * time.Second

// Redsync is a redsync lock per segment (redsync's defaults: 8 s expiry, 32
// tries 50–250 ms apart) around a read-check-deduct of the segment's
// counter, with the business step inside. redsync has no fencing: the
// writes trust that the lock is still held.
func Redsync(addr string) bench.Spec {
	return bench.Spec{Name: "redsync", Title: "redsync lock per segment (Redis)", Step: true,
		New: func() bench.Strategy { return &redsyncStrategy{addr: addr} }}
}

type redsyncStrategy struct {
	addr string
	p    bench.Params
	cs   []*redis.Client
	rs   []*redsync.Redsync
}

func (s *redsyncStrategy) counter(i int) string   { return fmt.Sprintf("%sstock:%d", s.p.Prefix, i) }
func (s *redsyncStrategy) record(o string) string { return s.p.Prefix + "order:" + o }

func (s *redsyncStrategy) Setup(ctx context.Context, p bench.Params) error {
	s.p = p
	s.cs = clients(s.addr, p)
	for _, c := range s.cs {
		s.rs = append(s.rs, redsync.New(goredis.NewPool(c)))
	}
	pipe := s.cs[0].Pipeline()
	for i := range p.Segments {
		pipe.Set(ctx, s.counter(i), p.Units, 0)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return fmt.Errorf("put the stock counters: %w", err)
	}
	return nil
}

func (s *redsyncStrategy) Buy(ctx context.Context, buyer int, order string, qty int64, routeKey string) (replayed bool, err error) {
	proc := s.p.Process(buyer)
	c := s.cs[proc]
	place := segments.Route(routeKey, s.p.Segments)
	m := s.rs[proc].NewMutex(fmt.Sprintf("%slock:%d", s.p.Prefix, place))
	if err := m.LockContext(ctx); err != nil {
		return false, fmt.Errorf("lock segment %d: %w", place, err)
	}
	defer func() {
		uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), unlockTimeout)
		defer cancel()
		if ok, uerr := m.UnlockContext(uctx); (uerr != nil || !ok) && err == nil {
			err = fmt.Errorf("unlock segment %d: %w (held %v)", place, uerr, ok)
		}
	}()
	vals, err := c.MGet(ctx, s.counter(place), s.record(order)).Result()
	if err != nil {
		return false, fmt.Errorf("read segment %d: %w", place, err)
	}
	if vals[1] != nil {
		return true, nil
	}
	str, _ := vals[0].(string)
	have, err := strconv.ParseInt(str, 10, 64)
	if err != nil {
		return false, fmt.Errorf("segment %d: bad counter %v", place, vals[0])
	}
	if have < qty {
		return false, fmt.Errorf("segment %d: want %d, have %d: %w", place, qty, have, coordinator.ErrInsufficientStock)
	}
	if err := s.p.Step(ctx, buyer); err != nil {
		return false, err
	}
	// What users of redsync write: the lock is trusted to still be held.
	if _, err := c.TxPipelined(ctx, func(pipe redis.Pipeliner) error {
		pipe.Set(ctx, s.counter(place), have-qty, 0)
		pipe.Set(ctx, s.record(order), qty, 0)
		return nil
	}); err != nil {
		return false, fmt.Errorf("deduct at segment %d: %w", place, err)
	}
	return false, nil
}

func (s *redsyncStrategy) Verify(ctx context.Context) (bench.Books, error) {
	b := bench.Books{Stock: int64(s.p.Segments) * s.p.Units}
	return b, readBooks(ctx, s.cs[0], s.p.Prefix+"stock:*", s.p.Prefix+"order:*", &b)
}

func (s *redsyncStrategy) Teardown(ctx context.Context) error {
	if len(s.cs) == 0 {
		return nil
	}
	err := deleteMatching(ctx, s.cs[0], s.p.Prefix+"*")
	return errors.Join(err, closeAll(s.cs))
}
