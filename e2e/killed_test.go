package e2e

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/stockctl/stockctl/coordinator"
	"github.com/stockctl/stockctl/internal/engines"
	"github.com/stockctl/stockctl/internal/etcdtest"
)

// A separate OS process (this test binary in helper mode) holds the locks
// of three segments of a SKU, each inside an AllocateFunc whose business
// step never ends, and allocates in a loop; it is SIGKILLed mid-sale.
//
// Invariants:
//   - buyers of this process, on the segments it holds, are served while the helper
//     holds its locks, and between the kill and the moment its locks are free;
//   - each of the dead process's segment locks is acquired by another process
//     within TTL + 1 s of the kill (plus freeTolerance for a loaded machine);
//   - each allocation the helper had sent is either fully recorded (claim and
//     order record written together, for its quantity, parts adding up) or
//     absent, every one it had acknowledged is recorded, and the allocations
//     whose steps never returned are absent;
//   - the books balance.
func TestKilledProcess(t *testing.T) { runKilledProcess(t, false) }

// The same on a SKU of the second of two clusters: the helper, the waiter
// and the buyers are coordinators over both (coordinator.NewClusters), the
// helper's lease and locks are the second cluster's.
func TestKilledProcessOnSecondCluster(t *testing.T) { runKilledProcess(t, true) }

func runKilledProcess(t *testing.T, second bool) {
	etcd := etcdtest.NewSingle(t, etcdtest.WithNoFsync()) // the SKU's cluster
	const sku, segs = "kill", 8
	hold := []int{0, 1, 2}
	// The waiter is another process queued for the held segments' locks
	// themselves: a stock etcd Mutex on each lock's prefix (the locks keep
	// concurrency.Mutex's key protocol). An order would not wait there: a
	// seller serves it from any segment it can hold.
	var waiter, buyers, inSKU *coordinator.Coordinator // inSKU: waiter's coordinator of the SKU's cluster
	var firstEndpoints []string
	if second {
		firstEndpoints = etcdtest.NewSingle(t, etcdtest.WithNoFsync()).Endpoints()
		waiter = newFleetCoord(t, firstEndpoints, etcd.Endpoints(), coordinator.WithSessionTTL(ttl))
		buyers = newFleetCoord(t, firstEndpoints, etcd.Endpoints(), coordinator.WithSessionTTL(ttl))
		inSKU = waiter.Cluster("second")
	} else {
		waiter = newCoord(t, etcd.Endpoints(), coordinator.WithSessionTTL(ttl))
		buyers = newCoord(t, etcd.Endpoints(), coordinator.WithSessionTTL(ttl))
		inSKU = waiter
	}
	ctx, cancel := etcdtest.HangContext(t)
	defer cancel()
	cluster := ""
	if second {
		cluster = "second"
	}
	if _, err := waiter.CreateSKUIn(ctx, cluster, sku, coordinator.SKUConfig{Total: segs * 5000, Segments: segs, InitialFill: segs * 5000}); err != nil {
		t.Fatal(err)
	}

	hcfg := helperConfig{
		Mode: "alloc", Endpoints: etcd.Endpoints(), TTLSec: int(ttl / time.Second), SKU: sku,
		Hold:  hold,
		Churn: routeKeysFor(t, segs, 3, 2),
	}
	if second {
		hcfg.Endpoints, hcfg.SecondEndpoints = firstEndpoints, etcd.Endpoints()
	}
	helper := startHelper(t, hcfg)
	etcdtest.WaitFor(t, "the helper to hold its segments and acknowledge allocations", 60*time.Second, func() bool {
		return helper.count("HOLD ") == len(hold) && helper.count("ACK ") >= 20
	})

	// Buyers on the other segments, bounded in count (8 × 1000 orders of
	// one unit: less than the 20,000 units of their segments, so they never
	// need the held ones) and by stop.
	var served sync.Map // order → time served
	var servedN atomic.Int64
	var stop atomic.Bool
	var wg sync.WaitGroup
	buyerErrs := make(chan error, 8)
	for b := range 8 {
		route := routeKeyFor(t, segs, 4+b%4)
		wg.Go(func() {
			for n := 0; n < 1000 && !stop.Load(); n++ {
				order := fmt.Sprintf("buyer-%d-%d", b, n)
				actx, acancel := context.WithTimeout(ctx, 10*time.Second)
				_, err := buyers.Allocate(actx, sku, order, 1, route)
				acancel()
				if err != nil {
					buyerErrs <- fmt.Errorf("buyer %d order %s: %w", b, order, err)
					return
				}
				served.Store(order, time.Now())
				servedN.Add(1)
			}
		})
	}
	etcdtest.WaitFor(t, "buyers served while the helper holds its locks", 30*time.Second, func() bool { return servedN.Load() >= 20 })

	// The segments the helper holds: those whose oldest lock key is under
	// its lease (the three never-ending steps, and what its churn sells from).
	var lease int64
	for _, l := range helper.Lines() {
		if h, ok := strings.CutPrefix(l, "LEASE "); ok {
			lease, _ = strconv.ParseInt(h, 16, 64)
		}
	}
	var held []int
	for seg := range segs {
		resp, err := inSKU.Client().Get(ctx, engines.Of(inSKU).Keys.SegmentLock(sku, seg), clientv3.WithFirstCreate()...)
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.Kvs) > 0 && resp.Kvs[0].Lease == lease {
			held = append(held, seg)
		}
	}
	if lease == 0 || len(held) < len(hold) {
		t.Fatalf("the helper (lease %x) holds segments %v: want at least %d, one per never-ending step", lease, held, len(hold))
	}
	t.Logf("the helper holds segments %v", held)
	homes := hold // the never-ending steps' orders are named after their home
	hold = held

	// Queue behind each held lock before the kill, so that the acquisition
	// is timed from the kill and not from a later lock call.
	acquired := make([]time.Time, len(hold))
	waitErrs := make([]error, len(hold))
	// A segment the helper only sold from (not a never-ending step's) may
	// be given up before the kill (it went idle, or another process wanted
	// it): its waiter then gets it at once, and it is not timed.
	got := make([]atomic.Bool, len(hold))
	var waiters sync.WaitGroup
	wsess, err := concurrency.NewSession(inSKU.Client(), concurrency.WithTTL(int(ttl/time.Second)))
	if err != nil {
		t.Fatal(err)
	}
	defer wsess.Close()
	for i, seg := range hold {
		m := concurrency.NewMutex(wsess, strings.TrimSuffix(engines.Of(inSKU).Keys.SegmentLock(sku, seg), "/"))
		waiters.Go(func() {
			if waitErrs[i] = m.Lock(ctx); waitErrs[i] == nil {
				acquired[i] = time.Now()
				got[i].Store(true)
				waitErrs[i] = m.Unlock(ctx)
			}
		})
	}
	for i, seg := range hold {
		key := fmt.Sprintf("%s%x", engines.Of(inSKU).Keys.SegmentLock(sku, seg), int64(wsess.Lease()))
		etcdtest.WaitFor(t, fmt.Sprintf("the waiter queued on segment %d", seg), 30*time.Second, func() bool {
			if got[i].Load() {
				return true
			}
			resp, err := inSKU.Client().Get(ctx, key, clientv3WithPrefixCount()...)
			return err == nil && resp.Count == 1
		})
	}

	killedAt := helper.kill(t)
	waiters.Wait()
	var slowest time.Duration
	timed := 0
	for i, seg := range hold {
		if waitErrs[i] != nil {
			t.Fatalf("waiter on segment %d: %v", seg, waitErrs[i])
		}
		freed := acquired[i].Sub(killedAt)
		if freed < 0 {
			t.Logf("segment %d: given up by the helper before the kill (acquired %v before it)", seg, (-freed).Round(time.Millisecond))
			continue
		}
		timed++
		t.Logf("segment %d: lock acquired by another process %v after the SIGKILL", seg, freed.Round(time.Millisecond))
		slowest = max(slowest, freed)
	}
	// The three never-ending steps hold their segments until the kill.
	if timed < len(homes) {
		t.Fatalf("only %d of the helper's segments were still held at the kill; its %d never-ending steps hold one each", timed, len(homes))
	}
	lastFreed := killedAt.Add(slowest)
	stop.Store(true)
	wg.Wait()
	close(buyerErrs)
	for err := range buyerErrs {
		t.Fatal(err)
	}
	duringOutage := 0
	served.Range(func(_, v any) bool {
		if at := v.(time.Time); at.After(killedAt) && at.Before(lastFreed) {
			duringOutage++
		}
		return true
	})
	t.Logf("locks freed after %v at most (bound TTL + 1 s = %v, + tolerance %v); buyers on other segments served %d orders in all, %d between the kill and the last lock freed",
		slowest.Round(time.Millisecond), ttl+time.Second, freeTolerance, servedN.Load(), duringOutage)
	if slowest > ttl+time.Second+freeTolerance {
		t.Errorf("the dead process's locks were freed %v after the kill, more than TTL + 1 s (+%v tolerance)", slowest, freeTolerance)
	}
	if duringOutage == 0 {
		t.Error("no buyer on another segment was served between the kill and the locks being freed")
	}

	// Every allocation the helper sent is whole or absent.
	sent := map[string]int64{}
	acked := map[string]bool{}
	for _, l := range helper.Lines() {
		f := strings.Fields(l)
		switch {
		case len(f) == 3 && f[0] == "SENT":
			q, err := strconv.ParseInt(f[2], 10, 64)
			if err != nil {
				t.Fatalf("helper line %q: %v", l, err)
			}
			sent[f[1]] = q
		case len(f) == 3 && f[0] == "ACK":
			acked[f[1]] = true
		}
	}
	var recorded, absent, inFlightRecorded, inFlightAbsent int
	for order, qty := range sent {
		o, ok := orderState(t, inSKU, sku, order)
		switch {
		case ok && o.Qty != qty:
			t.Errorf("order %s recorded with qty %d, sent with %d", order, o.Qty, qty)
		case !ok && acked[order]:
			t.Errorf("order %s was acknowledged but is not recorded", order)
		}
		if ok {
			recorded++
			if !acked[order] {
				inFlightRecorded++
			}
		} else {
			absent++
			inFlightAbsent++
		}
	}
	for _, seg := range homes {
		if _, ok := orderState(t, inSKU, sku, fmt.Sprintf("hold-%d", seg)); ok {
			t.Errorf("the allocation on segment %d whose step never returned is recorded", seg)
		}
	}
	rep := mustAudit(t, inSKU, sku)
	t.Logf("helper: %d allocations sent, %d acknowledged; unacknowledged at the kill: %d recorded whole, %d absent, none half-applied; audit %+v",
		len(sent), len(acked), inFlightRecorded, inFlightAbsent, *rep)
	if len(acked) == 0 || recorded < len(acked) {
		t.Fatalf("%d recorded of %d acknowledged", recorded, len(acked))
	}
}
