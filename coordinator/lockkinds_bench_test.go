package coordinator_test

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/stockctl/stockctl/coordinator"
	"github.com/stockctl/stockctl/internal/engines"
	"github.com/stockctl/stockctl/internal/etcdtest"
)

// BenchmarkLockKinds: acquire → fenced write → release cycles per second,
// 64 goroutines over 4 coordinators (4 processes' worth), etcd with fsync
// on, each kind in the same run:
//
//	exclusive:    Lock on one name
//	rw-90-shared: one read-write lock, 9 in 10 cycles RLock, 1 in 10 Lock
//	semaphore-10: AcquirePermit on one semaphore of limit 10
//
// Each cycle writes a key of its goroutine's own in a transaction fenced by
// the hold. Ratios to exclusive are printed at the end.
//
// Run: go test -run x -bench BenchmarkLockKinds -benchtime 3s ./coordinator
func BenchmarkLockKinds(b *testing.B) {
	etcd := etcdtest.NewSingle(b)
	const procs, goroutines = 4, 64
	cs := make([]*coordinator.Coordinator, procs)
	for i := range cs {
		c, err := coordinator.New(etcd.Client(b))
		if err != nil {
			b.Fatal(err)
		}
		defer c.Close()
		cs[i] = c
	}
	acquire := map[string]func(ctx context.Context, c *coordinator.Coordinator, i int64) (*coordinator.Lock, error){
		"exclusive": func(ctx context.Context, c *coordinator.Coordinator, _ int64) (*coordinator.Lock, error) {
			return c.Lock(ctx, "bench-x")
		},
		"rw-90-shared": func(ctx context.Context, c *coordinator.Coordinator, i int64) (*coordinator.Lock, error) {
			if i%10 == 0 {
				return c.Lock(ctx, "bench-rw")
			}
			return c.RLock(ctx, "bench-rw")
		},
		"semaphore-10": func(ctx context.Context, c *coordinator.Coordinator, _ int64) (*coordinator.Lock, error) {
			return c.AcquirePermit(ctx, "bench-sem", 10)
		},
	}
	rates := map[string]float64{}
	kinds := []string{"exclusive", "rw-90-shared", "semaphore-10"}
	for _, kind := range kinds {
		b.Run(kind, func(b *testing.B) {
			var next atomic.Int64
			var wg sync.WaitGroup
			errs := make(chan error, goroutines)
			b.ResetTimer()
			start := time.Now()
			for g := range goroutines {
				wg.Go(func() {
					ctx := context.Background()
					key := fmt.Sprintf("/bench/kinds/%s/%d", kind, g)
					for {
						i := next.Add(1)
						if i > int64(b.N) {
							return
						}
						l, err := acquire[kind](ctx, cs[g%procs], i)
						if err != nil {
							errs <- err
							return
						}
						resp, err := l.Txn(ctx).Then(clientv3.OpPut(key, strconv.FormatInt(i, 10))).Commit()
						if err == nil && !resp.Succeeded {
							err = fmt.Errorf("fenced write rejected while holding")
						}
						if uerr := l.Unlock(ctx); err == nil {
							err = uerr
						}
						if err != nil {
							errs <- err
							return
						}
					}
				})
			}
			wg.Wait()
			elapsed := time.Since(start)
			b.StopTimer()
			close(errs)
			for err := range errs {
				b.Fatal(err)
			}
			rate := float64(b.N) / elapsed.Seconds()
			b.ReportMetric(rate, "cycles/s")
			rates[kind] = rate
		})
	}
	if x := rates["exclusive"]; x > 0 && len(rates) == len(kinds) {
		fmt.Printf("cycles/s: exclusive %.0f, rw-90-shared %.0f (%.2fx), semaphore-10 %.0f (%.2fx)\n",
			x, rates["rw-90-shared"], rates["rw-90-shared"]/x, rates["semaphore-10"], rates["semaphore-10"]/x)
	}
}

// BenchmarkKindHandoffLatency: the time from one process's release to the
// next process's waiter holding, for each kind of handoff:
//
//	exclusive:     Lock → Lock
//	rw-x-to-s:     a writer's Unlock → a reader waiting in RLock
//	rw-s-to-x:     the last reader's Unlock → a writer waiting in Lock
//	semaphore-10:  one of 10 holders releases → the waiter in AcquirePermit
//
// Run: go test -run x -bench BenchmarkKindHandoffLatency -benchtime 20x ./coordinator
func BenchmarkKindHandoffLatency(b *testing.B) {
	etcd := etcdtest.NewSingle(b)
	cs := make([]*coordinator.Coordinator, 2)
	for i := range cs {
		c, err := coordinator.New(etcd.Client(b))
		if err != nil {
			b.Fatal(err)
		}
		defer c.Close()
		cs[i] = c
	}
	cli := etcd.Client(b)
	keys := engines.Of(cs[0]).Keys
	type kind struct {
		name   string
		pfx    string // where the waiter's key shows up
		keys   int64  // keys there once the waiter queued
		first  func(ctx context.Context) (release func() error, err error)
		second func(ctx context.Context) (*coordinator.Lock, error)
	}
	lockOf := func(l *coordinator.Lock, err error) (func() error, error) {
		if err != nil {
			return nil, err
		}
		return func() error { return l.Unlock(context.Background()) }, nil
	}
	// Nine permits held for the whole run: the measured one is the tenth.
	var nine []*coordinator.Lock
	for range 9 {
		l, err := cs[0].AcquirePermit(context.Background(), "handoff-sem", 10)
		if err != nil {
			b.Fatal(err)
		}
		nine = append(nine, l)
	}
	defer func() {
		for _, l := range nine {
			_ = l.Unlock(context.Background())
		}
	}()
	kinds := []kind{
		{"exclusive", keys.Lock("handoff-x"), 2,
			func(ctx context.Context) (func() error, error) { return lockOf(cs[0].Lock(ctx, "handoff-x")) },
			func(ctx context.Context) (*coordinator.Lock, error) { return cs[1].Lock(ctx, "handoff-x") }},
		{"rw-x-to-s", keys.Lock("handoff-rw1"), 2,
			func(ctx context.Context) (func() error, error) { return lockOf(cs[0].Lock(ctx, "handoff-rw1")) },
			func(ctx context.Context) (*coordinator.Lock, error) { return cs[1].RLock(ctx, "handoff-rw1") }},
		{"rw-s-to-x", keys.Lock("handoff-rw2"), 2,
			func(ctx context.Context) (func() error, error) { return lockOf(cs[0].RLock(ctx, "handoff-rw2")) },
			func(ctx context.Context) (*coordinator.Lock, error) { return cs[1].Lock(ctx, "handoff-rw2") }},
		{"semaphore-10", keys.Semaphore("handoff-sem"), 11,
			func(ctx context.Context) (func() error, error) {
				return lockOf(cs[0].AcquirePermit(ctx, "handoff-sem", 10))
			},
			func(ctx context.Context) (*coordinator.Lock, error) {
				return cs[1].AcquirePermit(ctx, "handoff-sem", 10)
			}},
	}
	p50 := map[string]time.Duration{}
	for _, k := range kinds {
		b.Run(k.name, func(b *testing.B) {
			ctx := context.Background()
			lat := make([]time.Duration, 0, b.N)
			for range b.N {
				release, err := k.first(ctx)
				if err != nil {
					b.Fatal(err)
				}
				got := make(chan time.Time, 1)
				go func() {
					l, err := k.second(ctx)
					got <- time.Now()
					if err == nil {
						err = l.Unlock(ctx)
					}
					if err != nil {
						b.Error(err)
					}
				}()
				for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
					resp, err := cli.Get(ctx, k.pfx, clientv3.WithPrefix(), clientv3.WithCountOnly())
					if err == nil && resp.Count == k.keys {
						break
					}
					if time.Now().After(deadline) {
						b.Fatal("the waiter never queued")
					}
				}
				released := time.Now()
				if err := release(); err != nil {
					b.Fatal(err)
				}
				lat = append(lat, (<-got).Sub(released))
			}
			slices.Sort(lat)
			p50[k.name] = lat[len(lat)/2]
			b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50-ms")
			b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds())/1000, "p99-ms")
		})
	}
	if x := p50["exclusive"]; x > 0 && len(p50) == len(kinds) {
		fmt.Printf("handoff p50: exclusive %v, rw-x-to-s %v (%.2fx), rw-s-to-x %v (%.2fx), semaphore-10 %v (%.2fx)\n", x,
			p50["rw-x-to-s"], float64(p50["rw-x-to-s"])/float64(x), p50["rw-s-to-x"], float64(p50["rw-s-to-x"])/float64(x),
			p50["semaphore-10"], float64(p50["semaphore-10"])/float64(x))
	}
}
