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
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/stockctl/stockctl/coordinator"
	"github.com/stockctl/stockctl/internal/etcdtest"
)

// BenchmarkLockCycles: lock → fenced write → unlock cycles per second on one
// lock, 64 goroutines, etcd with fsync on, all variants in one run:
//
//	stockctl-1proc:  64 goroutines sharing one coordinator (local queue + cohorting)
//	stockctl-4proc:  4 coordinators × 16 goroutines
//	stock-mutex:     concurrency.Mutex, one session per goroutine (the way to
//	                 make it safe for goroutines; a shared session is not)
//
// Run: go test -run x -bench BenchmarkLockCycles -benchtime 3s ./coordinator
func BenchmarkLockCycles(b *testing.B) {
	etcd := etcdtest.NewSingle(b)
	const goroutines = 64
	rates := map[string]float64{}

	run := func(b *testing.B, name string, cycle func(g int, i int) error) {
		b.Run(name, func(b *testing.B) {
			var next atomic.Int64
			var wg sync.WaitGroup
			errs := make(chan error, goroutines)
			b.ResetTimer()
			start := time.Now()
			for g := 0; g < goroutines; g++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for {
						i := next.Add(1)
						if i > int64(b.N) {
							return
						}
						if err := cycle(g, int(i)); err != nil {
							errs <- err
							return
						}
					}
				}()
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
			rates[name] = rate
		})
	}

	for _, procs := range []int{1, 4} {
		cs := make([]*coordinator.Coordinator, procs)
		for i := range cs {
			c, err := coordinator.New(etcd.Client(b))
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close()
			cs[i] = c
		}
		key := fmt.Sprintf("/bench/counter-%d", procs)
		run(b, fmt.Sprintf("stockctl-%dproc", procs), func(g, i int) error {
			ctx := context.Background()
			l, err := cs[g%procs].Lock(ctx, "bench")
			if err != nil {
				return err
			}
			resp, err := l.Txn(ctx).Then(clientv3.OpPut(key, strconv.Itoa(i))).Commit()
			if err == nil && !resp.Succeeded {
				err = fmt.Errorf("fenced write rejected while holding the lock")
			}
			if uerr := l.Unlock(ctx); err == nil {
				err = uerr
			}
			return err
		})
	}

	cli := etcd.Client(b)
	sessions := make([]*concurrency.Session, goroutines)
	for g := range sessions {
		s, err := concurrency.NewSession(cli)
		if err != nil {
			b.Fatal(err)
		}
		defer s.Close()
		sessions[g] = s
	}
	run(b, "stock-mutex", func(g, i int) error {
		ctx := context.Background()
		m := concurrency.NewMutex(sessions[g], "/bench/stock-mutex")
		if err := m.Lock(ctx); err != nil {
			return err
		}
		resp, err := cli.Txn(ctx).If(m.IsOwner()).Then(clientv3.OpPut("/bench/counter-stock", strconv.Itoa(i))).Commit()
		if err == nil && !resp.Succeeded {
			err = fmt.Errorf("fenced write rejected while holding the lock")
		}
		if uerr := m.Unlock(ctx); err == nil {
			err = uerr
		}
		return err
	})

	if s := rates["stock-mutex"]; s > 0 && len(rates) == 3 {
		fmt.Printf("cycles/s: stockctl-1proc %.0f (%.1fx stock), stockctl-4proc %.0f (%.1fx stock), stock-mutex %.0f",
			rates["stockctl-1proc"], rates["stockctl-1proc"]/s, rates["stockctl-4proc"], rates["stockctl-4proc"]/s, s)
		fmt.Println()
	}
}

// BenchmarkHandoffLatency: the time from one process's unlock to the next
// process's waiter holding the lock, for this lock's watch from read
// revision + 1 and for concurrency.Mutex's watch from the read revision
// (which etcd serves from its unsynced-watcher loop every 100 ms). Ours
// starts a synced watch and checks what it might have missed.
//
// Run: go test -run x -bench BenchmarkHandoffLatency -benchtime 20x ./coordinator
func BenchmarkHandoffLatency(b *testing.B) {
	etcd := etcdtest.NewSingle(b)
	p50 := map[string]time.Duration{}

	measure := func(b *testing.B, name string, lock func(ctx context.Context, who int) (unlock func() error, err error)) {
		b.Run(name, func(b *testing.B) {
			ctx := context.Background()
			lat := make([]time.Duration, 0, b.N)
			for i := 0; i < b.N; i++ {
				unlockA, err := lock(ctx, 0)
				if err != nil {
					b.Fatal(err)
				}
				got := make(chan time.Time, 1)
				queued := make(chan struct{})
				go func() {
					close(queued)
					unlockB, err := lock(ctx, 1)
					got <- time.Now()
					if err == nil {
						err = unlockB()
					}
					if err != nil {
						b.Error(err)
					}
				}()
				<-queued
				waitQueued(b, etcd, name)
				released := time.Now()
				if err := unlockA(); err != nil {
					b.Fatal(err)
				}
				lat = append(lat, (<-got).Sub(released))
			}
			slices.Sort(lat)
			p50[name] = lat[len(lat)/2]
			b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50-ms")
			b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds())/1000, "p99-ms")
		})
	}

	cs := make([]*coordinator.Coordinator, 2)
	for i := range cs {
		c, err := coordinator.New(etcd.Client(b))
		if err != nil {
			b.Fatal(err)
		}
		defer c.Close()
		cs[i] = c
	}
	measure(b, "stockctl", func(ctx context.Context, who int) (func() error, error) {
		l, err := cs[who].Lock(ctx, "handoff")
		if err != nil {
			return nil, err
		}
		return func() error { return l.Unlock(ctx) }, nil
	})

	cli := etcd.Client(b)
	sessions := make([]*concurrency.Session, 2)
	for i := range sessions {
		s, err := concurrency.NewSession(cli)
		if err != nil {
			b.Fatal(err)
		}
		defer s.Close()
		sessions[i] = s
	}
	measure(b, "stock-mutex", func(ctx context.Context, who int) (func() error, error) {
		m := concurrency.NewMutex(sessions[who], "/bench/handoff-stock")
		if err := m.Lock(ctx); err != nil {
			return nil, err
		}
		return func() error { return m.Unlock(ctx) }, nil
	})
	if ours, stock := p50["stockctl"], p50["stock-mutex"]; ours > 0 && stock > 0 {
		fmt.Printf("handoff p50: stockctl %v, stock mutex %v: %.0fx faster\n", ours, stock, float64(stock)/float64(ours))
	}
}

// waitQueued waits until the second waiter's key is in etcd, so that the
// measured handoff starts with a queued waiter.
func waitQueued(b *testing.B, etcd *etcdtest.Single, name string) {
	pfx := "/stockctl/locks/handoff/"
	if name == "stock-mutex" {
		pfx = "/bench/handoff-stock/"
	}
	cli := etcd.Client(b)
	defer cli.Close()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		resp, err := cli.Get(context.Background(), pfx, clientv3.WithPrefix(), clientv3.WithCountOnly())
		if err == nil && resp.Count == 2 {
			return
		}
	}
	b.Fatal("the second waiter never queued")
}
