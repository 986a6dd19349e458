package segments

import (
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/stockctl/stockctl/internal/etcdtest"
)

// A process's first order of a SKU, sold directly, peeks at the one segment
// it would sell from rather than look at the whole SKU; where that segment
// cannot be sold from directly (its lock has a key, another process sells
// it lazily, it holds too little), the order looks as before and is served
// elsewhere. In every case the order is served once and the books balance.
func TestColdDirectOrderPeeks(t *testing.T) {
	client := etcdtest.NewSingle(t, etcdtest.WithNoFsync()).Client(t)
	ctx := t.Context()
	const segments, fill = 4, 10
	for _, tc := range []struct {
		name string
		lazy bool
		// prepare runs after the SKU is made and the seller's view read;
		// home is the segment the order would sell from.
		prepare func(t *testing.T, e *Engine, sku string, home int)
		// lockFirst: another session holds home's lock before the
		// seller is made (its view then has the key).
		lockFirst  bool
		peeks      int64
		looks      int64
		servedHome bool
	}{
		{name: "free", peeks: 1, servedHome: true},
		{name: "free, lazy", lazy: true, peeks: 1, servedHome: true},
		{name: "its lock held before the view", lockFirst: true, peeks: 0, looks: 1},
		// The peek finds its lock's key, or the view does first (the
		// watch is quick): either way the order looks.
		{name: "its lock taken after the view", peeks: anyPeeks, looks: 1,
			prepare: func(t *testing.T, e *Engine, sku string, home int) { lockSegment(t, client, e, sku, home) }},
		{name: "sold lazily by another process", lazy: true, peeks: 1, looks: 1,
			prepare: func(t *testing.T, e *Engine, sku string, home int) {
				// Another owner's lazy counter with no sale since its base
				// holds what it says: the books stay balanced.
				put(t, client, e.keys.Segment(sku, home), EncodeSegmentCounter(SegmentCounter{N: fill, Owner: 12345, Base: 1}))
			}},
		{name: "too little there", peeks: 1, looks: 1,
			prepare: func(t *testing.T, e *Engine, sku string, home int) {
				// Its units moved to the pool: the books stay balanced.
				put(t, client, e.keys.Segment(sku, home), EncodeCounter(0))
				put(t, client, e.keys.Pool(sku), EncodeCounter(fill))
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			maker := etcdEngine(t, func(c *engineTestConfig) { c.client = client })
			buyer := etcdEngine(t, func(c *engineTestConfig) { c.client, c.lazy = client, tc.lazy })
			sku := fmt.Sprintf("peek-%d", buyer.owner)
			if _, err := maker.CreateSKU(ctx, sku, SKUConfig{Total: segments * fill, Segments: segments, InitialFill: segments * fill}); err != nil {
				t.Fatal(err)
			}
			info, err := buyer.sku(ctx, sku)
			if err != nil {
				t.Fatal(err)
			}
			// The seller's home for its direct orders, computed before its
			// view is read when a lock must be in that view: the process's
			// seat claimed first (its first order would start the claim and
			// wait for it, firstSeatWait, or go by a hash of its own).
			buyer.seat.Start()
			if buyer.seat.Wait(ctx, 20*time.Second) < 0 {
				t.Fatal("no seat after 20 s")
			}
			probe := &seller{e: buyer, sku: info, sts: make([]atomic.Pointer[placeState], segments)}
			home := probe.directHome()
			if tc.lockFirst {
				lockSegment(t, client, buyer, sku, home)
			}
			s, err := buyer.seller(info)
			if err != nil {
				t.Fatal(err)
			}
			<-s.viewed
			s.release()
			if tc.prepare != nil {
				tc.prepare(t, buyer, sku, home)
			}
			looks, peeks := buyer.looksRead.Load(), buyer.peeksRead.Load()
			a, err := buyer.Allocate(ctx, sku, "o-1", 1, "")
			if err != nil {
				t.Fatal(err)
			}
			if got := buyer.peeksRead.Load() - peeks; got != tc.peeks && (tc.peeks != anyPeeks || got > 1) {
				t.Errorf("%d peeks; want %d", got, tc.peeks)
			}
			if got := buyer.looksRead.Load() - looks; got != tc.looks {
				t.Errorf("%d looks; want %d", got, tc.looks)
			}
			if len(a.Parts) != 1 || a.Parts[0].Place.IsPool() {
				t.Fatalf("served from %+v; want one segment", a.Parts)
			}
			if atHome := a.Parts[0].Place.Index() == home; atHome != tc.servedHome {
				t.Errorf("served from segment %d, home %d; want at home: %v", a.Parts[0].Place.Index(), home, tc.servedHome)
			}
			// A retry is a replay, whichever path it takes.
			b, err := buyer.Allocate(ctx, sku, "o-1", 1, "")
			if err != nil || b.Revision != a.Revision {
				t.Errorf("the retry: %+v, %v; want the first allocation replayed (revision %d)", b, err, a.Revision)
			}
			rep, err := maker.Audit(ctx, sku)
			if err != nil {
				t.Fatal(err)
			}
			if !rep.OK || rep.Allocated != 1 {
				t.Errorf("audit: %+v; want the books balanced with 1 allocated", rep)
			}
		})
	}
}

// A peeked segment whose counter was created before the process read the
// SKU's meta record is verified under that incarnation (it has existed
// since, and the SKU's deletion would have deleted it), and the first
// commit there leaves the SKU's incarnation compare out (the counter's
// compare fences it: fencesIncarnation); one peeked after the SKU was
// deleted and created again (a counter created since) is not, and its
// commit compares the incarnation.
func TestPeekVerifiesTheIncarnation(t *testing.T) {
	client := etcdtest.NewSingle(t, etcdtest.WithNoFsync()).Client(t)
	ctx := t.Context()
	maker := etcdEngine(t, func(c *engineTestConfig) { c.client = client })
	buyer := etcdEngine(t, func(c *engineTestConfig) { c.client, c.lazy = client, true })
	cfg := SKUConfig{Total: 40, Segments: 4, InitialFill: 40}
	for _, recreated := range []bool{false, true} {
		t.Run(fmt.Sprintf("recreated=%v", recreated), func(t *testing.T) {
			sku := fmt.Sprintf("inc-%v", recreated)
			if _, err := maker.CreateSKU(ctx, sku, cfg); err != nil {
				t.Fatal(err)
			}
			info, err := buyer.sku(ctx, sku)
			if err != nil {
				t.Fatal(err)
			}
			s, err := buyer.seller(info)
			if err != nil {
				t.Fatal(err)
			}
			<-s.viewed
			defer s.release()
			if recreated {
				if _, err := maker.DeleteSKU(ctx, sku); err != nil {
					t.Fatal(err)
				}
				if _, err := maker.CreateSKU(ctx, sku, cfg); err != nil {
					t.Fatal(err)
				}
			}
			st, err := s.peekInto(ctx, 0, 1, false)
			if err != nil || st == nil {
				t.Fatalf("peek at segment 0: %v, %v; want it free to sell from", st, err)
			}
			st.mu.Lock()
			verified := st.direct.verified
			st.mu.Unlock()
			if want := map[bool]int64{false: info.created}[recreated]; verified != want {
				t.Fatalf("peeked segment verified under %d; want %d (the SKU known by its incarnation %d)", verified, want, info.created)
			}
			cr := order("o", commitPart{st: st, qty: 1, direct: true, lockPfx: buyer.keys.SegmentLock(sku, 0)})
			cr.req.sku = info
			_, plan := buyer.planPlaces(ctx, []*commitReq{cr})
			g := &txnGroup{batch: []*commitReq{cr}, order: plan}
			buyer.build(g)
			compared := false
			for _, c := range g.cmps {
				compared = compared || string(c.KeyBytes()) == buyer.keys.Meta(sku)
			}
			if compared != recreated {
				t.Errorf("the first commit compares the SKU's incarnation: %v; want %v", compared, recreated)
			}
		})
	}
}

// The segment a process prefers for a SKU's direct orders depends on the
// process, not on its etcd session: a process that sells only directly has
// none (its lease reads 0), and every such process picked the same segment
// of every SKU.
func TestDirectHomeIsPerProcess(t *testing.T) {
	a, b := testEngine(t), testEngine(t)
	a.owner, b.owner = 1, 2
	same := 0
	const skus, segments = 64, 20
	for i := range skus {
		info := &skuInfo{name: fmt.Sprint("sku-", i), segments: segments}
		ha := (&seller{e: a, sku: info, sts: make([]atomic.Pointer[placeState], segments)}).directHome()
		hb := (&seller{e: b, sku: info, sts: make([]atomic.Pointer[placeState], segments)}).directHome()
		if ha == hb {
			same++
		}
	}
	// 64 SKUs over 20 segments: about 3 alike by chance.
	if same > skus/4 {
		t.Errorf("two processes prefer the same segment for %d of %d SKUs", same, skus)
	}
}

// anyPeeks: the case may peek once or not at all.
const anyPeeks = -1

// lockSegment holds segment i of sku's lock from a session of its own
// until the test ends (etcd's mutex protocol, as another process would).
func lockSegment(t *testing.T, client *clientv3.Client, e *Engine, sku string, i int) {
	t.Helper()
	sess, err := concurrency.NewSession(client)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sess.Close() })
	if err := concurrency.NewMutex(sess, strings.TrimSuffix(e.keys.SegmentLock(sku, i), "/")).Lock(t.Context()); err != nil {
		t.Fatal(err)
	}
}

func put(t *testing.T, client *clientv3.Client, key, value string) {
	t.Helper()
	if _, err := client.Put(t.Context(), key, value); err != nil {
		t.Fatal(err)
	}
}

// Processes that sell a SKU directly start from different segments once
// each holds a seat (internal/seats): the first orders of four processes
// of each of 40 SKUs sell from four different segments. By a hash of the
// process alone, about a quarter of the SKUs had two processes on one
// segment, whose commits then raced for its counter.
func TestDirectHomesApartWithSeats(t *testing.T) {
	client := etcdtest.NewSingle(t, etcdtest.WithNoFsync()).Client(t)
	ctx := t.Context()
	const skus, segments, procs, fill = 40, 20, 4, 5
	maker := etcdEngine(t, func(c *engineTestConfig) { c.client = client })
	for i := range skus {
		if _, err := maker.CreateSKU(ctx, fmt.Sprint("apart-", i), SKUConfig{Total: segments * fill, Segments: segments, InitialFill: segments * fill}); err != nil {
			t.Fatal(err)
		}
	}
	var es []*Engine
	for range procs {
		e := etcdEngine(t, func(c *engineTestConfig) { c.client = client })
		e.seat.Start()
		es = append(es, e)
	}
	seatsHeld := map[int]bool{}
	for p, e := range es {
		k := e.seat.Wait(ctx, 20*time.Second)
		if k < 0 {
			t.Fatalf("process %d holds no seat after 20 s", p)
		}
		seatsHeld[k] = true
	}
	if len(seatsHeld) != procs {
		t.Fatalf("four processes hold seats %v", seatsHeld)
	}
	for i := range skus {
		sku := fmt.Sprint("apart-", i)
		by := map[int]int{} // segment → the process that sold from it
		for p, e := range es {
			a, err := e.Allocate(ctx, sku, fmt.Sprint("o-", p), 1, "")
			if err != nil {
				t.Fatal(err)
			}
			if len(a.Parts) != 1 || a.Parts[0].Place.IsPool() {
				t.Fatalf("%s, process %d: served from %+v; want one segment", sku, p, a.Parts)
			}
			idx := a.Parts[0].Place.Index()
			if q, ok := by[idx]; ok {
				t.Errorf("%s: processes %d and %d both sold from segment %d", sku, q, p, idx)
			}
			by[idx] = p
		}
		rep, err := maker.Audit(ctx, sku)
		if err != nil {
			t.Fatal(err)
		}
		if !rep.OK || rep.Allocated != procs {
			t.Errorf("%s: audit %+v; want the books balanced with %d allocated", sku, rep, procs)
		}
	}
}

// A process's very first order, of a cold SKU, starts the process's seat
// claim before it picks its segment, and sells from its seat's home: the
// first orders of a process all pick their segments before any of them
// commits, and when only a commit started the claim every one of them
// went by the hash of the process (5 to 7 % of the commits of a 3-second
// sale over 1,000 SKUs were refused by another process's sale from the
// same segment). The engines wait for their claims as long as it takes
// here (seatWait), so that a slow machine cannot send them to the hash.
func TestFirstOrderStartsTheSeatClaim(t *testing.T) {
	client := etcdtest.NewSingle(t, etcdtest.WithNoFsync()).Client(t)
	ctx := t.Context()
	const procs, segments, fill = 3, 20, 5
	maker := etcdEngine(t, func(c *engineTestConfig) { c.client = client })
	const sku = "first"
	if _, err := maker.CreateSKU(ctx, sku, SKUConfig{Total: segments * fill, Segments: segments, InitialFill: segments * fill}); err != nil {
		t.Fatal(err)
	}
	for p := range procs {
		e := etcdEngine(t, func(c *engineTestConfig) { c.client = client })
		e.seatWait = 20 * time.Second
		if k := e.seat.Index(); k >= 0 {
			t.Fatalf("process %d holds seat %d before any order", p, k)
		}
		a, err := e.Allocate(ctx, sku, fmt.Sprint("o-", p), 1, "")
		if err != nil {
			t.Fatal(err)
		}
		k := e.seat.Wait(ctx, 20*time.Second)
		if k < 0 {
			t.Fatalf("process %d holds no seat after its first order", p)
		}
		info, err := e.sku(ctx, sku)
		if err != nil {
			t.Fatal(err)
		}
		home := (&seller{e: e, sku: info, sts: make([]atomic.Pointer[placeState], segments)}).directHome()
		if len(a.Parts) != 1 || a.Parts[0].Place.IsPool() || a.Parts[0].Place.Index() != home {
			t.Errorf("process %d (seat %d): served from %+v; want segment %d, its seat's home", p, k, a.Parts, home)
		}
	}
	rep, err := maker.Audit(ctx, sku)
	if err != nil {
		t.Fatal(err)
	}
	if !rep.OK || rep.Allocated != procs {
		t.Errorf("audit %+v; want the books balanced with %d allocated", rep, procs)
	}
}
