package e2e

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stockctl/stockctl/coordinator"
	"github.com/stockctl/stockctl/internal/engines"
	"github.com/stockctl/stockctl/internal/etcdtest"
	"github.com/stockctl/stockctl/rebalance"
)

// The leading rebalancer is taken out mid-sale (30% sold, 40 buyers, most
// of the stock still in the pool): its process is SIGKILLed, or its lease
// revoked. A second rebalancer waits in the election. (Buyers that reach
// 50% wait for it to lead, so that the sale cannot end before it has
// anything to do.)
//
// Invariants:
//   - the waiting rebalancer leads within the TTL of the fault (+1 s, and
//     freeTolerance for a loaded machine), and moves stock afterwards;
//   - no move is applied twice: every move reported (OnMove, or the helper's
//     output) is exactly one move in etcd's history, at its revision, and
//     every move in the history was committed while its rebalancer led the
//     election and found its segment needing it (a refill: below the low
//     watermark; a drain: it moved all the segment held), which a repeated
//     move would not;
//   - no stock appears or vanishes: every pool change in the history is an
//     order, a restock or a balanced move;
//   - the sale sells out exactly and the books balance.
func TestRebalancerFailover(t *testing.T) {
	for _, tc := range []struct {
		name string
		kill bool
	}{
		{"SIGKILL the leader's process", true},
		{"revoke the leader's lease", false},
	} {
		t.Run(tc.name, func(t *testing.T) { runRebalancerFailover(t, tc.kill) })
	}
}

func runRebalancerFailover(t *testing.T, kill bool) {
	etcd := etcdtest.NewSingle(t, etcdtest.WithNoFsync())
	const sku, total, segs, wm = "rb", 1500, 8, 5
	opts := []coordinator.Option{coordinator.WithSessionTTL(ttl)}
	admin := newCoord(t, etcd.Endpoints(), opts...)
	ctx, cancel := etcdtest.HangContext(t)
	defer cancel()
	if _, err := admin.CreateSKU(ctx, sku, coordinator.SKUConfig{Total: total, Segments: segs, InitialFill: 80, LowWatermark: wm, RefillBatch: 20}); err != nil {
		t.Fatal(err)
	}
	created, err := admin.Client().Get(ctx, "e2e-revision")
	if err != nil {
		t.Fatal(err)
	}
	from := created.Header.Revision + 1
	start := stockAt(t, admin, sku, from-1)

	var log moveLog
	cfg := func(id string) rebalance.Config {
		return rebalance.Config{Identity: id, SweepInterval: 200 * time.Millisecond, OnMove: log.add}
	}
	const first, second = "rebalancer-1", "rebalancer-2"
	var helper *helperProc
	var firstCoord *coordinator.Coordinator
	if kill {
		helper = startHelper(t, helperConfig{Mode: "rebalance", Endpoints: etcd.Endpoints(), TTLSec: int(ttl / time.Second), Identity: first})
		etcdtest.WaitFor(t, "the helper's rebalancer to lead", 60*time.Second, func() bool { return helper.count("LEADER true") == 1 })
	} else {
		firstCoord = newCoord(t, etcd.Endpoints(), opts...)
		r1, _ := startRebalancer(t, firstCoord, cfg(first))
		etcdtest.WaitFor(t, "the first rebalancer to lead", 30*time.Second, r1.Leader)
	}
	r2, stop2 := startRebalancer(t, newCoord(t, etcd.Endpoints(), opts...), cfg(second))

	buyers := []*coordinator.Coordinator{newCoord(t, etcd.Endpoints(), opts...), newCoord(t, etcd.Endpoints(), opts...)}
	// The fault at 30% sold; buyers held at 50% until the successor leads,
	// so that it finds the pool still stocked and has work to do.
	gate := newFaultGate(total, 0.3, 0.5)
	wait := startSale(t, saleConfig(40, gatedBuy(gate, sku, buyers)))
	etcdtest.WaitFor(t, "30% of the stock sold", 60*time.Second, func() bool { return gate.reached(0) })
	if r2.Leader() {
		t.Fatal("the second rebalancer leads before the fault")
	}
	var faultAt time.Time
	if kill {
		faultAt = helper.kill(t)
	} else {
		sess, err := engines.Of(firstCoord).Locks.Session(ctx)
		if err != nil {
			t.Fatal(err)
		}
		faultAt = time.Now()
		if _, err := admin.Client().Revoke(ctx, sess.Lease()); err != nil {
			t.Fatal(err)
		}
	}
	gate.open(0)
	etcdtest.WaitFor(t, "the second rebalancer to lead", 30*time.Second, r2.Leader)
	took := time.Since(faultAt)
	etcdtest.WaitFor(t, "50% of the stock sold", 60*time.Second, func() bool { return gate.reached(1) })
	gate.open(1)
	res, err := wait()
	if err != nil {
		t.Fatal(err)
	}
	stop2()
	rep := checkSoldOut(t, admin, sku, total, res)

	// What the rebalancers said they did.
	reported := log.snapshot()
	if kill {
		for _, l := range helper.Lines() {
			f := strings.Fields(l)
			if len(f) != 7 || f[0] != "MOVE" {
				continue
			}
			seg, _ := strconv.Atoi(f[2])
			qty, _ := strconv.ParseInt(f[4], 10, 64)
			rev, _ := strconv.ParseInt(f[5], 10, 64)
			kind := rebalance.Refill
			if f[3] == rebalance.Drain.String() {
				kind = rebalance.Drain
			}
			reported = append(reported, rebalance.Move{SKU: f[1], Segment: seg, Kind: kind, Qty: qty, Revision: rev, Leader: f[6]})
		}
	}
	// What etcd applied.
	// Sellers' own pulls from the pool are theirs, not the rebalancers'.
	var moves []histMove
	pulls := 0
	for _, m := range movesIn(t, start, skuHistory(t, admin, sku, from)) {
		if m.pull {
			pulls++
		} else {
			moves = append(moves, m)
		}
	}
	applied := map[[2]int64]histMove{}
	for _, m := range moves {
		applied[[2]int64{m.rev, int64(m.seg)}] = m
	}
	seen := map[[2]int64]bool{}
	byLeader := map[string]int{}
	for _, m := range reported {
		k := [2]int64{m.Revision, int64(m.Segment)}
		h, ok := applied[k]
		switch {
		case seen[k]:
			t.Errorf("move %+v reported twice", m)
		case !ok || h.kind != m.Kind || h.qty != m.Qty:
			t.Errorf("reported move %+v is not what etcd applied at its revision (%v, found %v)", m, h, ok)
		}
		seen[k] = true
		byLeader[m.Leader]++
	}
	unreported := 0
	for _, h := range moves {
		leader := leaderAt(t, admin, h.rev)
		if !seen[[2]int64{h.rev, int64(h.seg)}] {
			unreported++
			// Only the killed process can have died between committing a
			// move and printing it.
			if !kill || leader != first {
				t.Errorf("%v was applied but never reported (leader then: %q)", h, leader)
			}
		}
		if leader != first && leader != second {
			t.Errorf("%v was committed while %q led the election", h, leader)
		}
		switch h.kind {
		case rebalance.Refill:
			if h.availBefore >= wm {
				t.Errorf("%v: the segment was not below the low watermark %d, so this refill repeats an earlier one", h, wm)
			}
		case rebalance.Drain:
			if h.qty != h.availBefore {
				t.Errorf("%v: a drain must move everything the segment held", h)
			}
		}
	}
	for _, m := range reported {
		if m.Leader == first {
			if l := leaderAt(t, admin, m.Revision); l != first {
				t.Errorf("move %+v by %s committed while %q led", m, first, l)
			}
		}
	}
	t.Logf("new leader %v after the fault (bound TTL + 1 s = %v, + tolerance %v); %d moves applied (%d by %s, %d by %s, %d unreported by the killed process), each once; %d pulls by sellers; audit %+v",
		took.Round(time.Millisecond), ttl+time.Second, freeTolerance, len(moves), byLeader[first], first, byLeader[second], second, unreported, pulls, *rep)
	if took > ttl+time.Second+freeTolerance {
		t.Errorf("the new leader took %v after the fault", took)
	}
	if byLeader[first] == 0 || byLeader[second] == 0 {
		t.Errorf("moves by leader: %v; want moves by both, before and after the failover", byLeader)
	}
}
