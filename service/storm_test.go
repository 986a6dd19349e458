package service_test

import (
	"bytes"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	stockctlv1 "github.com/stockctl/stockctl/api/stockctl/v1"
	"github.com/stockctl/stockctl/api/stockctl/v1/stockctlv1connect"
	"github.com/stockctl/stockctl/service"
)

// stormBound is the servers' bound in these tests; storms are 10 times it.
const stormBound = 8

// A storm of 10 times the bound of calls in flight, while the calls within
// the bound are stuck (etcd is down): every call beyond the bound is
// refused at once with OVERLOADED, none waits, the server never runs more
// than the bound of handlers, and memory and goroutines come back to where
// they were after each wave. The stuck calls complete once etcd is back.
func TestStormBeyondTheBound(t *testing.T) {
	e := newEnv(t, withConfig(func(c *service.Config) {
		c.MaxInflight, c.MaxStreams = stormBound, stormBound
		c.EtcdWait = hangBound // calls within the bound wait for etcd to come back
	}))
	createSKU(t, e.grpcStock(t), &stockctlv1.CreateSKURequest{Sku: "hot", Total: 100, Segments: 2, InitialFill: 100})
	e.etcd.Stop()
	waitFor(t, "the etcd connection to go down", func() bool { return !connReady(e) })

	// Fill the bound with calls that wait for etcd.
	stuck := e.grpcStock(t)
	var stuckErrs sync.WaitGroup
	var stuckFailed atomic.Int32
	for i := range stormBound {
		stuckErrs.Go(func() {
			_, err := stuck.Allocate(ctx(t), connect.NewRequest(&stockctlv1.AllocateRequest{Sku: "hot", Order: "stuck-" + string(rune('a'+i)), Qty: 1}))
			if err != nil {
				t.Errorf("a call within the bound failed: %v", err)
				stuckFailed.Add(1)
			}
		})
	}
	waitFor(t, "the bound to fill", func() bool { return handlersIn("(*Server).etcdReady") == stormBound })

	clientsByProto := []stockctlv1connect.StockServiceClient{e.grpcStock(t), e.stock(t, connectJSON)}
	routeKey := strings.Repeat("k", 1000)
	runtime.GC()
	var base runtime.MemStats
	runtime.ReadMemStats(&base)
	baseGoroutines := runtime.NumGoroutine()
	var maxHandlers atomic.Int32
	for wave := range 5 {
		stop := make(chan struct{})
		var sampler sync.WaitGroup
		sampler.Go(func() { // how many handlers run while the storm lasts
			for {
				if n := int32(handlersIn("service.stockService.Allocate")); n > maxHandlers.Load() {
					maxHandlers.Store(n)
				}
				select {
				case <-stop:
					return
				default:
					runtime.Gosched()
				}
			}
		})
		var refused atomic.Int32
		parallel(10*stormBound, func(i int) {
			c := clientsByProto[i%2]
			_, err := c.Allocate(ctx(t), connect.NewRequest(&stockctlv1.AllocateRequest{Sku: "hot", Order: "storm", Qty: 1, RouteKey: routeKey}))
			if code, reason := errorInfo(t, err); code == connect.CodeResourceExhausted && reason == "OVERLOADED" {
				refused.Add(1)
			} else {
				t.Errorf("wave %d call %d: %v, want OVERLOADED", wave, i, err)
			}
		})
		close(stop)
		sampler.Wait()
		if refused.Load() != 10*stormBound {
			t.Fatalf("wave %d: %d of %d refused", wave, refused.Load(), 10*stormBound)
		}
		runtime.GC()
		var now runtime.MemStats
		runtime.ReadMemStats(&now)
		// Clients' idle connections and their goroutines stay; allow for
		// them, not for anything per call.
		t.Logf("wave %d: %d calls refused; goroutines %d (before the storms %d); heap %+d KiB",
			wave, refused.Load(), runtime.NumGoroutine(), baseGoroutines, (int64(now.HeapAlloc)-int64(base.HeapAlloc))>>10)
		if g := runtime.NumGoroutine(); g > baseGoroutines+4*stormBound {
			t.Errorf("wave %d: %d goroutines after the storm, %d before", wave, g, baseGoroutines)
		}
		if grown := int64(now.HeapAlloc) - int64(base.HeapAlloc); grown > 16<<20 {
			t.Errorf("wave %d: heap grew %d bytes", wave, grown)
		}
	}
	t.Logf("at most %d Allocate handlers ran at once during the storms (bound %d)", maxHandlers.Load(), stormBound)
	if n := maxHandlers.Load(); n > stormBound {
		t.Fatalf("%d handlers ran at once during the storm, bound %d", n, stormBound)
	}
	if got := handlersIn("(*Server).etcdReady"); got != stormBound {
		t.Fatalf("%d calls still wait for etcd, want the %d within the bound", got, stormBound)
	}
	e.etcd.Restart(t)
	stuckErrs.Wait()
	if stuckFailed.Load() == 0 {
		if au := audit(t, e.grpcStock(t), "hot"); au.Orders != stormBound {
			t.Fatalf("%d orders, want the %d calls within the bound", au.Orders, stormBound)
		}
	}
	if got := counter(t, e, "stockctl_api_rejected_total", "reason", "overloaded"); got != 5*10*stormBound {
		t.Fatalf("rejected_total{overloaded} = %v, want %d", got, 5*10*stormBound)
	}
}

// The long bound (streams, lock acquisitions) is separate: calls waiting
// for a lock fill it, and the next is refused at once while short calls
// are still served.
func TestLongCallsBound(t *testing.T) {
	e := newEnv(t, withConfig(func(c *service.Config) { c.MaxStreams = stormBound }))
	locks := e.grpcLocks(t)
	held := acquireLease(t, locks, &stockctlv1.AcquireRequest{Name: "busy", Ttl: durationpb.New(service.MaxLockTTL)})
	var waiting sync.WaitGroup
	for range stormBound {
		waiting.Go(func() {
			res, err := locks.Acquire(ctx(t), connect.NewRequest(&stockctlv1.AcquireRequest{Name: "busy"}))
			if err != nil {
				t.Errorf("waiting Acquire: %v", err)
				return
			}
			_, _ = locks.Release(ctx(t), connect.NewRequest(&stockctlv1.LockServiceReleaseRequest{HoldId: res.Msg.HoldId}))
		})
	}
	waitFor(t, "the long bound to fill", func() bool { return handlersIn("service.lockService.Acquire") == stormBound })
	parallel(10*stormBound, func(int) {
		_, err := locks.Acquire(ctx(t), connect.NewRequest(&stockctlv1.AcquireRequest{Name: "other"}))
		wantError(t, "Acquire beyond the long bound", err, connect.CodeResourceExhausted, stockctlv1.ErrorReason_ERROR_REASON_OVERLOADED)
	})
	// Short calls have their own bound.
	if _, err := locks.KeepAlive(ctx(t), connect.NewRequest(&stockctlv1.KeepAliveRequest{HoldId: held.HoldId})); err != nil {
		t.Fatal(err)
	}
	if _, err := locks.Release(ctx(t), connect.NewRequest(&stockctlv1.LockServiceReleaseRequest{HoldId: held.HoldId})); err != nil {
		t.Fatal(err)
	}
	waiting.Wait()
}

// Storm tests count goroutines of the whole test binary: they do not run
// in parallel with other tests (t.Parallel tests wait for them).

// handlersIn counts the goroutines whose stack holds frame.
func handlersIn(frame string) int {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	count := 0
	for _, g := range bytes.Split(buf, []byte("\n\n")) {
		if bytes.Contains(g, []byte(frame)) {
			count++
		}
	}
	return count
}
