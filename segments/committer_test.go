package segments

import (
	"context"
	"fmt"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/stockctl/stockctl/internal/etcdtest"
)

// A batch of direct orders over two segments, one of which another process
// writes between the plan and the commit (its counter's ModRevision moves):
// the orders on the other segment are served by the same transaction, and
// only those on the moved one are answered raced (they climb the ladder):
// the commit goes flat first, and when that is refused, nested, a group
// each (sendGroups).
// Orders joined by a buyer (one counter) stand or fall together: both are
// refused, the one on the untouched segment sent again. On the embedded
// etcd and on Debian's etcd 3.4 (skipped without it): nested transactions
// are etcd 3.3's.
func TestRaceLostOnOnePlaceFailsOnlyItsOrders(t *testing.T) {
	t.Run("embedded", func(t *testing.T) {
		raceLostOnOnePlace(t, etcdtest.NewSingle(t, etcdtest.WithNoFsync()).Client(t))
	})
	t.Run("etcd 3.4", func(t *testing.T) {
		raceLostOnOnePlace(t, etcdtest.NewExternal(t, etcdtest.WithNoFsync()).Client(t))
	})
}

func raceLostOnOnePlace(t *testing.T, client *clientv3.Client) {
	cases := []struct {
		name      string
		buyer     string // both orders', when set: the SKU has a per-user limit
		served    bool   // the untouched segment's order served by the first transaction
		sentAgain bool   // ... or handed back to be sent again
		unmoved   bool   // nobody writes segment 1: both served, by one flat transaction
	}{
		{name: "nothing moved", served: true, unmoved: true},
		{name: "independent places", served: true},
		{name: "one buyer on both places", buyer: "ann", sentAgain: true},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ctx := t.Context()
			e := etcdEngine(t, func(c *engineTestConfig) { c.client = client })
			sku := fmt.Sprint("race-", i)
			cfg := SKUConfig{Total: 100, Segments: 2, InitialFill: 100}
			if tc.buyer != "" {
				cfg.PerUserLimit = 10
			}
			if _, err := e.CreateSKU(ctx, sku, cfg); err != nil {
				t.Fatal(err)
			}
			info, err := e.sku(ctx, sku)
			if err != nil {
				t.Fatal(err)
			}
			// Each segment as a direct seller's cache holds it, one unit
			// reserved for one order.
			var batch []*commitReq
			var sts []*placeState
			for seg := range 2 {
				st := directCacheOf(t, e, client, sku, seg, 0)
				if ok, _ := st.reserveDirect(1, 0, 0); !ok {
					t.Fatalf("segment %d cannot give 1 unit: %+v", seg, st.direct)
				}
				req := &allocReq{sku: info, order: fmt.Sprint("order-", seg), qty: 1, buyer: tc.buyer}
				if tc.buyer != "" {
					req.userKey = e.keys.User(sku, tc.buyer)
				}
				part := commitPart{st: st, qty: 1, direct: true, lockPfx: e.keys.SegmentLock(sku, seg)}
				batch = append(batch, &commitReq{req: req, parts: []commitPart{part}, ctx: ctx, done: make(chan struct{})})
				sts = append(sts, st)
			}
			if !tc.unmoved {
				// Another process writes segment 1 (the same units: the books
				// stay as they are).
				resp, err := client.Get(ctx, sts[1].key)
				if err != nil {
					t.Fatal(err)
				}
				if _, err := client.Put(ctx, sts[1].key, string(resp.Kvs[0].Value)); err != nil {
					t.Fatal(err)
				}
			}
			if e.nestUntil.Load() != 0 {
				t.Fatal("a new engine nests its commits")
			}
			again, deferred := e.direct.commitOnce(ctx, batch)
			// Two groups (independent places) are sent flat first (no
			// commit refused yet), refused by the moved segment's compare,
			// then nested: each group's outcome below, and the engine's
			// next commits nested for a while. One group (one buyer) is
			// sent as it is.
			if until := e.nestUntil.Load(); (tc.served && !tc.unmoved) != (until > time.Now().UnixNano()) {
				t.Fatalf("the engine nests until %d after the commit; want a time to come: %v", until, tc.served)
			}
			if len(deferred) != 0 {
				t.Fatalf("%d orders deferred; want none", len(deferred))
			}
			if r := answered(batch[1]); tc.unmoved && (r == nil || r.kind != resServed) {
				t.Fatalf("the order on segment 1, unmoved: %+v; want served", r)
			} else if !tc.unmoved && (r == nil || r.kind != resShort || !r.raced) {
				t.Fatalf("the order on the moved segment: %+v; want answered raced (resShort)", r)
			}
			first := answered(batch[0])
			switch {
			case tc.served && (first == nil || first.kind != resServed || len(again) != 0):
				t.Fatalf("the order on the untouched segment: %+v, %d sent again; want served by the same transaction", first, len(again))
			case tc.sentAgain && (first != nil || len(again) != 1 || again[0] != batch[0]):
				t.Fatalf("the order on the untouched segment: %+v, %d sent again; want sent again (its buyer's counter is shared)", first, len(again))
			}
			for _, cr := range again {
				cr.finish(failed(context.Canceled))
			}
			// What etcd holds: the served order's record and its segment's
			// counter, nothing of the raced one.
			for seg, want := range []bool{tc.served, tc.unmoved} {
				resp, err := client.Get(ctx, e.keys.Order(sku, fmt.Sprint("order-", seg)))
				if err != nil {
					t.Fatal(err)
				}
				if got := len(resp.Kvs) == 1; got != want {
					t.Errorf("order-%d recorded: %v; want %v", seg, got, want)
				}
			}
			rep, err := e.Audit(ctx, sku)
			if err != nil {
				t.Fatal(err)
			}
			wantAllocated := map[bool]int64{true: 1, false: 0}[tc.served]
			if tc.unmoved {
				wantAllocated = 2
			}
			if !rep.OK || rep.Allocated != wantAllocated {
				t.Fatalf("audit: %+v; want the books balanced, %d allocated", rep, wantAllocated)
			}
			if tc.buyer != "" {
				resp, err := client.Get(ctx, e.keys.User(sku, tc.buyer), clientv3.WithCountOnly())
				if err != nil || resp.Count != 0 {
					t.Fatalf("the buyer's counter: %d keys, %v; want none written", resp.Count, err)
				}
			}
		})
	}
}

// answered is a request's result once it has one, else nil.
func answered(cr *commitReq) *placeResult {
	select {
	case <-cr.done:
		return &cr.res
	default:
		return nil
	}
}

// How a batch splits into groups that share no key: orders on one place,
// or of one buyer, are in one group; groups keep the order of their first
// requests; a batch with no direct place, or whose groups would not fit
// the server's max-txn-ops as nested transactions, is sent whole.
func TestTxnGroups(t *testing.T) {
	e := testEngine(t)
	p, q, r := newTestPlace(0, 10, 0), newTestPlace(1, 10, 0), newTestPlace(2, 10, 0)
	d := &placeState{sku: "s", place: Segment(9), key: "/t/stock/s/seg/9", inKey: "/t/stock/s/in/9",
		direct: directState{known: true, value: 100, mod: 5, raw: SegmentCounter{N: 100}}}
	buyer := func(cr *commitReq, u string) *commitReq { cr.req.userKey = "/t/users/s/" + u; return cr }
	held := []*commitReq{
		order("a", p.part(1)), order("b", q.part(1)), order("c", p.part(1)),
		buyer(order("d", q.part(1)), "u"), buyer(order("e", r.part(1)), "u"),
	}
	direct := order("f", commitPart{st: d, qty: 1, direct: true, lockPfx: "/t/stocklocks/s/seg/9/"})
	users := []*batchUser{{key: "/t/users/s/u", add: 2}}
	ids := func(gs []*txnGroup) string {
		var out []string
		for _, g := range gs {
			s := ""
			for _, cr := range g.batch {
				s += cr.req.order
			}
			s += fmt.Sprintf("/%dplaces/%dbuyers", len(g.order), len(g.users))
			out = append(out, s)
		}
		return fmt.Sprint(out)
	}
	groups := func(batch []*commitReq) string {
		t.Helper()
		places, order := e.planPlaces(t.Context(), batch)
		for _, pp := range places {
			if pp.lost || pp.short || pp.err != nil {
				t.Fatalf("place %v not plannable: %+v", pp.st.place, *pp)
			}
		}
		gs := e.txnGroups(batch, order, users)
		for _, g := range gs {
			// Each group's Else reads end with its buyers' reads.
			diag := e.elseReads(g, nil, 1)
			if len(diag) < len(g.users) || len(g.cmps) == 0 || len(g.ops) == 0 {
				t.Errorf("group %s built with %d compares, %d writes, %d reads", g.batch[0].req.order, len(g.cmps), len(g.ops), len(diag))
			}
		}
		return ids(gs)
	}
	if got, want := groups(held), "[abcde/3places/1buyers]"; got != want {
		t.Errorf("held places only: groups %s; want %s (sent flat)", got, want)
	}
	withDirect := append(held[:len(held):len(held)], direct)
	if got, want := groups(withDirect), "[ac/1places/0buyers bde/2places/1buyers f/1places/0buyers]"; got != want {
		t.Errorf("with a direct place: groups %s; want %s", got, want)
	}
	// Nested, the largest group (2 held places, 3 orders, a buyer) needs
	// max(8 compares, 6 writes, 6 reads) <= max-txn-ops less the 3 groups.
	for _, tc := range []struct {
		limit int
		want  string
	}{{11, "[ac/1places/0buyers bde/2places/1buyers f/1places/0buyers]"}, {10, "[abcdef/4places/1buyers]"}} {
		e.cfg.MaxTxnOps = tc.limit
		if got := groups(withDirect); got != tc.want {
			t.Errorf("max-txn-ops %d: groups %s; want %s", tc.limit, got, tc.want)
		}
	}
}

// A group of direct orders leaves out its SKU's incarnation compare when
// every place it sells from was seen under that incarnation (the counter's
// compare fences it), and keeps it otherwise: a cache a peek filled (not
// verified), one verified under another incarnation, a held place.
func TestIncarnationFencedByVerifiedCounters(t *testing.T) {
	e := testEngine(t)
	info := &skuInfo{name: "s", segments: 4, created: 7}
	direct := func(i int, mod, verified int64) commitPart {
		st := &placeState{sku: "s", place: Segment(i), key: fmt.Sprintf("/t/stock/s/seg/%d", i), inKey: fmt.Sprintf("/t/stock/s/in/%d", i),
			direct: directState{known: true, value: 100, mod: mod, raw: SegmentCounter{N: 100}, verified: verified}}
		return commitPart{st: st, qty: 1, direct: true, lockPfx: fmt.Sprintf("/t/stocklocks/s/seg/%d/", i)}
	}
	meta := e.keys.Meta("s")
	for _, tc := range []struct {
		name    string
		parts   [][]commitPart // per order
		compare bool
	}{
		{"verified", [][]commitPart{{direct(0, 5, 7)}, {direct(1, 6, 7)}}, false},
		{"a peek's cache", [][]commitPart{{direct(0, 5, 7)}, {direct(1, 6, 0)}}, true},
		{"another incarnation", [][]commitPart{{direct(0, 5, 3)}}, true},
		{"held", [][]commitPart{{newTestPlace(2, 10, 0).part(1)}}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var batch []*commitReq
			for i, parts := range tc.parts {
				cr := order(fmt.Sprint("o", i), parts...)
				cr.req.sku = info
				batch = append(batch, cr)
			}
			places, plan := e.planPlaces(t.Context(), batch)
			for _, pp := range places {
				if pp.lost || pp.short || pp.err != nil {
					t.Fatalf("place %v not plannable: %+v", pp.st.place, *pp)
				}
			}
			g := &txnGroup{batch: batch, order: plan}
			e.build(g)
			compared := false
			for _, c := range g.cmps {
				if string(c.KeyBytes()) == meta {
					compared = true
				}
			}
			if compared != tc.compare {
				t.Errorf("the SKU's incarnation compared: %v, want %v (%d compares)", compared, tc.compare, len(g.cmps))
			}
		})
	}
}
