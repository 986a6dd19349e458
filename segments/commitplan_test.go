package segments

import (
	"fmt"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"

	"github.com/stockctl/stockctl/internal/background"
	"github.com/stockctl/stockctl/internal/keys"
	"github.com/stockctl/stockctl/internal/lock"
)

// Unit tests of the group commit's planning, without etcd: which requests
// share a transaction, what each place's counter becomes, and how a failed
// transaction's Else reads are answered.

// testPlace is a place whose cache is valid under a live ownership, as the
// committer finds it for a segment this process holds.
type testPlace struct {
	st  *placeState
	own *lock.Ownership
	end func(error)
}

func newTestPlace(i int, value, inbox int64) testPlace {
	own, end := lock.NewTestOwnership(fmt.Sprintf("/t/stocklocks/s/seg/%d/1", i), int64(100+i))
	st := &placeState{sku: "s", place: Segment(i), key: fmt.Sprintf("/t/stock/s/seg/%d", i), inKey: fmt.Sprintf("/t/stock/s/in/%d", i),
		token: own.Rev(), value: value, modRev: 10, inKnown: true, inbox: inbox, inMod: 11}
	return testPlace{st: st, own: own, end: end}
}

func (p testPlace) part(qty int64) commitPart { return commitPart{st: p.st, own: p.own, qty: qty} }

func order(id string, parts ...commitPart) *commitReq {
	return &commitReq{req: &allocReq{sku: &skuInfo{name: "s", segments: 4}, order: id, qty: 1}, parts: parts, done: make(chan struct{})}
}

func TestSelectOrdersFitsMaxTxnOps(t *testing.T) {
	p := newTestPlace(0, 1000, 0)
	q := newTestPlace(1, 1000, 0)
	var queue []*commitReq
	for i := range 200 {
		queue = append(queue, order(fmt.Sprint("o", i), p.part(1)))
	}
	// One place: 2 compares and 1 put, plus per order 1 and 1 (the
	// record is the ID's claim): the compares bound it, n + 2 <= 128.
	batch, rest, full := selectOrders(queue, 128, heldPlaceCost, nil)
	if len(batch) != 126 || len(rest) != 74 || !full {
		t.Fatalf("one place: %d in the batch, %d left, full %v; want 126, 74, full", len(batch), len(rest), full)
	}
	if batch[0].req.order != "o0" || rest[0].req.order != "o126" {
		t.Errorf("not in arrival order: batch starts %s, rest %s", batch[0].req.order, rest[0].req.order)
	}
	// A place per order (many SKUs): each costs 3 compares and 2 puts.
	queue = queue[:0]
	for i := range 100 {
		queue = append(queue, order(fmt.Sprint("o", i), newTestPlace(i, 10, 0).part(1)))
	}
	if batch, _, _ := selectOrders(queue, 128, heldPlaceCost, nil); len(batch) != 42 {
		t.Errorf("a place per order: %d in the batch; want 42", len(batch))
	}
	// Reservations put their index key; buyers add a compare and a put
	// once per buyer.
	queue = queue[:0]
	for i := range 100 {
		cr := order(fmt.Sprint("o", i), p.part(1))
		cr.req.ttl = time.Minute
		cr.req.userKey = fmt.Sprint("/t/users/s/b", i%2)
		queue = append(queue, cr)
	}
	if batch, _, _ := selectOrders(queue, 128, heldPlaceCost, nil); len(batch) != 62 {
		t.Errorf("reservations of two buyers: %d in the batch; want 62 (2n + 1 + 2 puts <= 128)", len(batch))
	}
	// Direct places: 3 compares and 2 puts each (directPlaceCost), 1
	// and 1 while lean; a place that stops being lean (a later part of
	// it would need its inbox) is charged the difference.
	lean := func(i int, isLean bool) commitPart {
		pt := newTestPlace(i, 10, 0).part(1)
		pt.direct, pt.lean = true, isLean
		return pt
	}
	// A SKU with an incarnation (created) adds its compare once, unless
	// its orders' places are lean: their counters fence it.
	for _, tc := range []struct {
		name    string
		lean    bool
		created int64
		want    int
	}{{"not lean", false, 0, 32}, {"lean", true, 0, 64}, {"not lean, SKUs created", false, 7, 25}, {"lean, SKUs created", true, 7, 64}} {
		queue = queue[:0]
		for i := range 100 {
			cr := order(fmt.Sprint("o", i), lean(i, tc.lean))
			cr.req.sku.created = tc.created
			queue = append(queue, cr)
		}
		if batch, _, _ := selectOrders(queue, 128, directPlaceCost, nil); len(batch) != tc.want {
			t.Errorf("a direct place per order, %s: %d in the batch; want %d", tc.name, len(batch), tc.want)
		}
	}
	shared := lean(0, true)
	queue = queue[:0]
	for i := range 200 {
		pt := shared
		pt.lean = i != 1 // the second order on the place needs its inbox
		queue = append(queue, order(fmt.Sprint("o", i), pt))
	}
	if batch, _, _ := selectOrders(queue, 128, directPlaceCost, nil); len(batch) != 125 {
		t.Errorf("one direct place, lean but for one part: %d in the batch; want 125 (n + 3 <= 128)", len(batch))
	}
	// The first request goes whatever its size.
	var big []commitPart
	for i := range 70 { // 141 compares
		big = append(big, newTestPlace(i, 10, 0).part(1))
	}
	if batch, _, _ := selectOrders([]*commitReq{order("big", big...), order("next", q.part(1))}, 128, heldPlaceCost, nil); len(batch) != 1 || batch[0].req.order != "big" {
		t.Errorf("an oversized first request: batch %d; want it alone", len(batch))
	}
}

func TestSelectOrdersNeverTwoOfOneID(t *testing.T) {
	p := newTestPlace(0, 10, 0)
	queue := []*commitReq{order("a", p.part(1)), order("b", p.part(1)), order("a", p.part(1)), order("c", p.part(1))}
	batch, rest, full := selectOrders(queue, 128, heldPlaceCost, nil)
	if len(batch) != 3 || len(rest) != 1 || rest[0] != queue[2] || full {
		t.Fatalf("batch %d, rest %d, full %v; want the second \"a\" alone left for the next batch, not full", len(batch), len(rest), full)
	}
}

// testEngine is an engine with no etcd: enough for the planning paths that
// read nothing (every cache valid), and queues that can be told of a loss.
func testEngine(t testing.TB) *Engine {
	t.Helper()
	bg := background.NewGroup()
	t.Cleanup(func() { bg.Stop(); bg.Wait() })
	space, err := keys.New("/t/")
	if err != nil {
		t.Fatal(err)
	}
	locks := lock.New(nil, nil, bg, lock.Config{})
	return NewEngine(nil, nil, locks, bg, Config{Keys: space, MaxTxnOps: 128, CommitTimeout: time.Second})
}

func TestPlanBatch(t *testing.T) {
	e := testEngine(t)
	plenty := newTestPlace(0, 10, 0)   // the counter alone gives it
	absorbing := newTestPlace(1, 1, 5) // counter + inbox gives it
	short := newTestPlace(2, 1, 1)     // neither: changed under the lock
	lost := newTestPlace(3, 10, 0)     // its key is gone
	lost.end(lock.ErrLost)
	stale := newTestPlace(0, 10, 0) // a second key for place 0 in one batch
	stale.st = plenty.st
	batch := []*commitReq{
		order("a", plenty.part(3)), order("b", plenty.part(2)),
		order("c", absorbing.part(4)),
		order("d", short.part(3)),
		order("e", lost.part(1)),
	}
	places, planned := e.planPlaces(t.Context(), batch)
	if len(planned) != 4 {
		t.Fatalf("%d places planned; want 4", len(planned))
	}
	if pp := places[plenty.st]; pp.take != 5 || pp.n != 2 || pp.value != 5 || pp.absorb || pp.lost || pp.short || pp.mod != 10 {
		t.Errorf("plenty: %+v; want take 5 of 2 parts, counter 10 → 5 at ModRevision 10", *pp)
	}
	if pp := places[absorbing.st]; !pp.absorb || pp.value != 2 || pp.inMod != 11 {
		t.Errorf("absorbing: %+v; want the inbox absorbed (1 + 5 − 4 = 2), compared at ModRevision 11", *pp)
	}
	if pp := places[short.st]; !pp.short {
		t.Errorf("short: %+v; want a shortage", *pp)
	}
	if pp := places[lost.st]; !pp.lost {
		t.Errorf("lost: %+v; want lost", *pp)
	}
	for _, pp := range planned {
		if pp.fence != lockFence {
			t.Errorf("a held part's place planned with fence %d; want lockFence", pp.fence)
		}
	}
	// Two keys for one place: the older one is gone.
	places, _ = e.planPlaces(t.Context(), []*commitReq{order("f", plenty.part(1)), order("g", commitPart{st: plenty.st, own: stale.own, qty: 1})})
	if !places[plenty.st].lost {
		t.Error("a place under two keys in one batch is not marked lost")
	}
}

// kvs is a Get's answer in a transaction's Else branch.
func kvs(kv ...*mvccpb.KeyValue) *pb.ResponseOp {
	return &pb.ResponseOp{Response: &pb.ResponseOp_ResponseRange{ResponseRange: &pb.RangeResponse{Kvs: kv}}}
}

func TestAnswerRefused(t *testing.T) {
	e := testEngine(t)
	held := newTestPlace(0, 10, 0)
	gone := newTestPlace(1, 10, 0)
	q, err := e.locks.Queue("/t/stocklocks/s/seg/1/", lock.KindSegment)
	if err != nil {
		t.Fatal(err)
	}
	defer e.locks.Unref(q)
	ps := []commitPart{held.part(1), gone.part(1)}
	ps[1].q = q
	a, b := order("a", ps[0]), order("b", ps[1])
	places, planned := e.planPlaces(t.Context(), []*commitReq{a, b})
	// The Else reads, in the order the batch was built: per place its lock
	// key, per order its ID's claim. Place 0 is still ours; place 1's key
	// is gone.
	rs := []*pb.ResponseOp{
		kvs(&mvccpb.KeyValue{Key: []byte(held.own.Key()), CreateRevision: held.own.Rev()}),
		kvs(),
		kvs(), kvs(),
	}
	again, stillHeld := e.answerRefused(t.Context(), []*commitReq{a, b}, places, planned, rs, nil)
	if len(again) != 1 || again[0] != a {
		t.Fatalf("%d sent again; want order a alone", len(again))
	}
	if len(stillHeld) != 1 || stillHeld[0].st != held.st {
		t.Errorf("%d places to read again; want place 0 alone", len(stillHeld))
	}
	select {
	case <-b.done:
		if !b.res.retryable() {
			t.Errorf("order b on a lost place: %v; want a lost lock (nothing deducted)", b.res.err)
		}
	default:
		t.Error("order b on a lost place was not answered")
	}
}

// A refused batch's places are read again from a pair of Gets each (only
// the counter for the pool).
func TestRefreshFrom(t *testing.T) {
	e := testEngine(t)
	seg := newTestPlace(0, 10, 0)
	pool := newTestPlace(1, 10, 0)
	pool.st.inKey, pool.st.inKnown = "", false
	rs := []*pb.ResponseOp{
		kvs(&mvccpb.KeyValue{Key: []byte(seg.st.key), Value: []byte(EncodeCounter(7)), ModRevision: 20}),
		kvs(&mvccpb.KeyValue{Key: []byte(seg.st.inKey), Value: []byte(EncodeCounter(3)), ModRevision: 21}),
		kvs(&mvccpb.KeyValue{Key: []byte(pool.st.key), Value: []byte(EncodeCounter(40)), ModRevision: 22}),
	}
	e.refreshFrom([]*placePlan{{st: seg.st, own: seg.own}, {st: pool.st, own: pool.own}}, rs)
	if seg.st.value != 7 || seg.st.modRev != 20 || seg.st.inbox != 3 || seg.st.inMod != 21 {
		t.Errorf("segment cache not refreshed: value %d@%d inbox %d@%d", seg.st.value, seg.st.modRev, seg.st.inbox, seg.st.inMod)
	}
	if pool.st.value != 40 || pool.st.modRev != 22 {
		t.Errorf("pool cache not refreshed: value %d@%d", pool.st.value, pool.st.modRev)
	}
}

// An absorb's answer can arrive after a refill's that landed later in the
// inbox it emptied: the cache takes the counter the absorb wrote, and keeps
// the newer deposit (before this, it added the deposit to the counter and
// dropped it from the inbox, and the next commit lost the absorbed units).
func TestAbsorbedKeepsALaterDeposit(t *testing.T) {
	p := newTestPlace(0, 4, 6) // counter 4 @10, inbox 6 @11
	p.st.mu.Lock()
	p.st.seeInboxLocked(5, 31) // a refill at revision 31 put 5 into the emptied inbox
	p.st.mu.Unlock()
	p.st.absorbed(p.own, 10, 30) // the absorb at revision 30: counter 4 + 6
	if p.st.value != 10 || p.st.modRev != 30 || p.st.inbox != 5 || p.st.inMod != 31 {
		t.Errorf("cache after the absorb: counter %d@%d inbox %d@%d; want 10@30 and 5@31", p.st.value, p.st.modRev, p.st.inbox, p.st.inMod)
	}
	q := newTestPlace(1, 4, 6)
	q.st.absorbed(q.own, 10, 30)
	if q.st.value != 10 || q.st.inbox != 0 || q.st.inMod != 30 {
		t.Errorf("cache after a plain absorb: counter %d inbox %d@%d; want 10, 0@30", q.st.value, q.st.inbox, q.st.inMod)
	}
}

// With a commit in flight, the next batch takes only requests that share
// no place, buyer or order ID with it (they go when it is answered), and
// none when everything waiting conflicts.
func TestSelectOrdersBesideACommitInFlight(t *testing.T) {
	e := testEngine(t)
	hot, cold := newTestPlace(0, 100, 0), newTestPlace(1, 100, 0)
	first := []*commitReq{order("a", hot.part(1))}
	if batch, _ := e.held.selectBatch(first); len(batch) != 1 {
		t.Fatalf("an empty committer took %d", len(batch))
	}
	queue := []*commitReq{order("b", hot.part(1)), order("c", cold.part(1)), order("a", cold.part(1))}
	batch, rest := e.held.selectBatch(queue)
	if len(batch) != 1 || batch[0].req.order != "c" || len(rest) != 2 {
		t.Fatalf("beside a commit on place 0 of order a: took %d (first %v); want order c alone", len(batch), batch)
	}
	if batch, _ := e.held.selectBatch(rest); len(batch) != 0 {
		t.Fatalf("everything waiting conflicts with commits in flight, yet %d were taken", len(batch))
	}
	e.held.inflight.unmark(first)
	if batch, _ := e.held.selectBatch(rest); len(batch) != 1 || batch[0].req.order != "b" {
		t.Fatalf("after the first commit, took %v; want order b (order a's ID is still in flight)", batch)
	}
}

// A commit may go beside a batch (the batcher's SpillOnly) when the batch
// was full or smaller than spillBelow; not when it left only requests that
// conflict with a commit in flight, nor when it took all that waited.
func TestSpillsOnAFullOrSmallBatch(t *testing.T) {
	e := testEngine(t)
	f := &e.held.inflight
	places := make([]testPlace, 20)
	for i := range places {
		places[i] = newTestPlace(i, 1000, 0)
	}
	orders := func(prefix string, n int, place func(i int) testPlace) []*commitReq {
		var q []*commitReq
		for i := range n {
			q = append(q, order(fmt.Sprint(prefix, i), place(i).part(1)))
		}
		return q
	}
	first, _ := e.held.selectBatch(orders("a", 10, func(i int) testPlace { return places[i] }))
	if len(first) != 10 || f.spills() {
		t.Fatalf("all 10 waiting taken: batch %d, spills %v; want 10, no spill", len(first), f.spills())
	}
	// 10 on the places in flight, then 9 on others.
	queue := append(orders("b", 10, func(i int) testPlace { return places[i] }), orders("c", 9, func(i int) testPlace { return places[10+i] })...)
	second, rest := e.held.selectBatch(queue)
	if len(second) != 9 || len(rest) != 10 || f.spills() {
		t.Fatalf("beside a commit in flight: batch %d, left %d, spills %v; want 9, 10, no spill", len(second), len(rest), f.spills())
	}
	f.unmark(first)
	f.unmark(second)
	if batch, _ := e.held.selectBatch(orders("d", 200, func(int) testPlace { return places[0] })); len(batch) != 126 || !f.spills() {
		t.Fatalf("200 orders on one place: batch %d, spills %v; want 126, full: spill", len(batch), f.spills())
	} else {
		f.unmark(batch)
	}
	if batch, _ := e.held.selectBatch(orders("e", spillBelow-1, func(i int) testPlace { return places[i] })); len(batch) != spillBelow-1 || !f.spills() {
		t.Fatalf("%d orders: batch %d, spills %v; want all, small: spill", spillBelow-1, len(batch), f.spills())
	}
}

// How a lazy engine sells at each direct place (planPlaces, planDirect): owned places
// lazily (no counter written) unless a settle is due or the batch is hot;
// an exact place nobody owns is written in the batch, claimed (named as
// this process's) when cold and left ownerless when hot; a place lazy
// under another owner is short (takeDirects takes it over first).
func TestPlanDirectModes(t *testing.T) {
	const self, other = int64(7), int64(9)
	place := func(i int, d directState) *placeState {
		d.known = true
		return &placeState{sku: "s", place: Segment(i), key: fmt.Sprintf("/t/stock/s/seg/%d", i), direct: d}
	}
	cases := []struct {
		name    string
		d       directState
		orders  int
		lazy    bool
		short   bool
		settle  bool
		written SegmentCounter
		sells   string // "lazily" or "written"
	}{
		{"owned, cold", directState{value: 100, mod: 5, raw: SegmentCounter{N: 100, Owner: self}, owned: true, owner: self}, 2, true, false, false, SegmentCounter{}, "lazily"},
		{"owned, settle due", directState{value: 100, mod: 5, raw: SegmentCounter{N: 100, Owner: self}, owned: true, owner: self, unsettled: settleEvery - 1}, 2, true, false, true, SegmentCounter{N: 98, Owner: self}, "lazily"},
		{"owned, hot", directState{value: 100, mod: 5, raw: SegmentCounter{N: 100, Owner: self}, owned: true, owner: self}, hotPlace, true, false, true, SegmentCounter{N: 100 - hotPlace}, "lazily"},
		{"exact, nobody's, cold: claimed", directState{value: 100, mod: 5, raw: SegmentCounter{N: 100}}, 2, true, false, true, SegmentCounter{N: 98, Owner: self}, "written"},
		{"exact, nobody's, hot: left ownerless", directState{value: 100, mod: 5, raw: SegmentCounter{N: 100}}, hotPlace, true, false, true, SegmentCounter{N: 100 - hotPlace}, "written"},
		{"lazy under another owner", directState{value: 100, mod: 5, raw: SegmentCounter{N: 100, Owner: other}, owner: other}, 2, true, true, false, SegmentCounter{}, "written"},
		{"marked, nobody's, unsettled sales", directState{value: 100, mod: 5, raw: SegmentCounter{N: 100, Base: 3}}, 2, true, true, false, SegmentCounter{}, "written"},
		{"not lazy engine", directState{value: 100, mod: 5, raw: SegmentCounter{N: 100}}, 2, false, false, true, SegmentCounter{N: 98}, "written"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			st := place(0, tc.d)
			var batch []*commitReq
			for i := range tc.orders {
				batch = append(batch, order(fmt.Sprint("o", i), commitPart{st: st, qty: 1, direct: true}))
			}
			e := testEngine(t)
			e.cfg.LazySegments, e.owner = tc.lazy, self
			places, _ := e.planPlaces(t.Context(), batch)
			dp := places[st]
			if dp.fence != counterFence {
				t.Fatalf("a direct part's place planned with fence %d; want counterFence", dp.fence)
			}
			if dp.short != tc.short {
				t.Fatalf("short %v; want %v (%+v)", dp.short, tc.short, *dp)
			}
			if tc.short {
				return
			}
			if dp.settle != tc.settle || (tc.settle && dp.written != tc.written) {
				t.Errorf("settle %v writing %+v; want %v writing %+v", dp.settle, dp.written, tc.settle, tc.written)
			}
			if lazily := dp.lazy; lazily != (tc.sells == "lazily") {
				t.Errorf("sold lazily: %v; want %s (a place not sold lazily compares its lock's range empty)", lazily, tc.sells)
			}
		})
	}
}
