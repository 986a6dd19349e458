package segments

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/stockctl/stockctl/internal/etcdtest"
	"github.com/stockctl/stockctl/internal/seats"
)

// lazySeller is a lazy engine on client that claims its seat at start
// (Config.SeatAtStart), as a selling service's coordinator does; it fails
// the test if the seat is not held.
func lazySeller(t *testing.T, client *clientv3.Client) *Engine {
	t.Helper()
	e := etcdEngine(t, func(c *engineTestConfig) { c.client, c.lazy, c.seatAtStart = client, true, true })
	etcdtest.WaitFor(t, "the seller's seat", 10*time.Second, func() bool { return e.seat.Index() >= 0 })
	return e
}

// counterOf reads segment i of sku: its counter and ModRevision.
func counterOf(t *testing.T, e *Engine, sku string, i int) (SegmentCounter, int64) {
	t.Helper()
	resp, err := e.client.Get(t.Context(), e.keys.Segment(sku, i))
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("read segment %d of %s: %v (%d keys)", i, sku, err, len(resp.Kvs))
	}
	c, err := DecodeSegmentCounter(string(resp.Kvs[0].Key), resp.Kvs[0].Value)
	if err != nil {
		t.Fatal(err)
	}
	return c, resp.Kvs[0].ModRevision
}

func etcdRev(t *testing.T, e *Engine) int64 {
	t.Helper()
	resp, err := e.client.Get(t.Context(), "rev")
	if err != nil {
		t.Fatal(err)
	}
	return resp.Header.Revision
}

// A SKU created while a lazy seller holds its seat is born with the
// seller's home segment named to it (CreateSKU's bornHomes): the seller's
// first orders there write their records and nothing else (no takeover,
// no claim), the counter is never written, and every reader counts the
// segment right. A seat whose holder names no owner (an eager engine, or
// a binary older than the seat's value) gets no home: its first order
// claims the segment as before (the control: two keys).
func TestBornHomeFirstOrdersWriteOnlyTheirRecords(t *testing.T) {
	for _, tc := range []struct {
		name      string
		lazy      bool
		seatAfter bool // the seller's seat is claimed after the SKU is created
		wantKeys  int  // keys written by the 5 orders
		// wantReads: the peeks and looks of the 5 orders (a born home is
		// sold from without reading it: bornInto).
		wantReads int64
		wantBorn  int64
	}{
		{name: "lazy seller", lazy: true, wantKeys: 5, wantReads: 0, wantBorn: 1},
		{name: "lazy seller seated after the creation", lazy: true, seatAfter: true, wantKeys: 6, wantReads: 1}, // a peek, a claim
		{name: "eager seller", lazy: false, wantKeys: 10, wantReads: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			client := etcdtest.NewSingle(t, etcdtest.WithNoFsync()).Client(t)
			creator := etcdEngine(t, func(c *engineTestConfig) { c.client, c.lazy = client, true })
			seller := etcdEngine(t, func(c *engineTestConfig) { c.client, c.lazy, c.seatAtStart = client, tc.lazy, !tc.seatAfter })
			ctx := t.Context()
			const sku = "born"
			if !tc.seatAfter {
				etcdtest.WaitFor(t, "the seller's seat", 10*time.Second, func() bool { return seller.seat.Index() >= 0 })
			}
			if _, err := creator.CreateSKU(ctx, sku, SKUConfig{Total: 100, Segments: 4, InitialFill: 100}); err != nil {
				t.Fatal(err)
			}
			if tc.seatAfter {
				seller.seat.Start()
				etcdtest.WaitFor(t, "the seller's seat", 10*time.Second, func() bool { return seller.seat.Index() >= 0 })
			}
			home := seats.Home(sku, seller.seat.Index(), 4)
			for i := range 4 {
				c, _ := counterOf(t, creator, sku, i)
				wantOwner := int64(0)
				if tc.lazy && !tc.seatAfter && i == home {
					wantOwner = seller.owner
				}
				if c.N != 25 || c.Owner != wantOwner || c.Base != 0 {
					t.Fatalf("segment %d born as %+v; want 25 units, owner %x (the seller's home is %d)", i, c, wantOwner, home)
				}
			}
			_, bornMod := counterOf(t, creator, sku, home)
			from := etcdRev(t, seller)
			reads := seller.peeksRead.Load() + seller.looksRead.Load()
			for i := range 5 {
				a, err := seller.Allocate(ctx, sku, fmt.Sprint("o", i), 1, "")
				if err != nil {
					t.Fatal(err)
				}
				if len(a.Parts) != 1 || a.Parts[0].Place != Segment(home) {
					t.Fatalf("order %d sold from %+v; want the seller's home, segment %d", i, a.Parts, home)
				}
			}
			if got := len(etcdtest.KeysPut(t, seller.client, seller.keys.Prefix(), from, etcdRev(t, seller))); got != tc.wantKeys {
				t.Fatalf("5 first orders wrote %d keys; want %d", got, tc.wantKeys)
			}
			if got := seller.peeksRead.Load() + seller.looksRead.Load() - reads; got != tc.wantReads {
				t.Errorf("5 first orders read the SKU %d times (peeks and looks); want %d", got, tc.wantReads)
			}
			if got := seller.bornSeeded.Load(); got != tc.wantBorn {
				t.Errorf("%d places seeded as born homes; want %d", got, tc.wantBorn)
			}
			if c, mod := counterOf(t, creator, sku, home); tc.lazy && !tc.seatAfter && (mod != bornMod || c.N != 25) {
				t.Fatalf("the born home's counter was written: %+v at %d, born at %d", c, mod, bornMod)
			}
			for _, e := range []*Engine{creator, seller} {
				if st, err := e.Status(ctx, sku); err != nil || st.Remaining() != 95 {
					t.Fatalf("status: %+v, %v; want 95 left", st, err)
				}
				if r, err := e.Audit(ctx, sku); err != nil || !r.OK || r.Allocated != 5 {
					t.Fatalf("audit: %+v, %v", r, err)
				}
			}
		})
	}
}

// A born home is adopted once: after the seller's caches of the SKU are
// forgotten (the reaper), the counter still names it at its birth
// revision, with its lazy sales since in records only. Adopting it again
// at its N would sell them twice; the seller must count them (a takeover)
// instead. Sold out from there, it serves exactly the fill, and refuses.
func TestBornHomeAdoptedOnce(t *testing.T) {
	client := etcdtest.NewSingle(t, etcdtest.WithNoFsync()).Client(t)
	seller := lazySeller(t, client)
	ctx := t.Context()
	const sku, fill = "once", 10
	if _, err := seller.CreateSKU(ctx, sku, SKUConfig{Total: fill, Segments: 1, InitialFill: fill}); err != nil {
		t.Fatal(err)
	}
	if c, _ := counterOf(t, seller, sku, 0); c.Owner != seller.owner {
		t.Fatalf("the one segment was born %+v, not named to the seller", c)
	}
	served := 0
	for i := range 4 {
		if _, err := seller.Allocate(ctx, sku, fmt.Sprint("a", i), 1, ""); err != nil {
			t.Fatal(err)
		}
		served++
	}
	if _, mod := counterOf(t, seller, sku, 0); mod >= etcdRev(t, seller)-3 {
		t.Fatalf("the counter was written by the lazy orders (ModRevision %d)", mod)
	}
	etcdtest.WaitFor(t, "the idle seller to be forgotten", 30*time.Second, func() bool {
		seller.evictIdle(time.Now().Add(2 * time.Hour))
		sellers, places, _, _ := seller.footprint()
		return sellers == 0 && places == 0
	})
	for i := 0; ; i++ {
		_, err := seller.Allocate(ctx, sku, fmt.Sprint("b", i), 1, "")
		var short *InsufficientStockError
		if errors.As(err, &short) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if served++; served > fill {
			t.Fatalf("served %d orders of %d units", served, fill)
		}
	}
	if served != fill {
		t.Fatalf("served %d orders, then refused; want the whole fill, %d", served, fill)
	}
	if r, err := seller.Audit(ctx, sku); err != nil || !r.OK || r.Allocated != fill {
		t.Fatalf("audit: %+v, %v", r, err)
	}
}

// Two sellers whose homes a SKU was born with sell it out together, many
// orders at once, each taking the other's home when its own is dry (a
// takeover that counts the other's records, and fails its next lazy
// commit): every unit is sold once, none twice, and the books balance.
// A third home is named to a process that has gone (a seat key whose
// holder never sells): its units are sold too, by a takeover.
func TestBornHomesSellOutTogether(t *testing.T) {
	client := etcdtest.NewSingle(t, etcdtest.WithNoFsync()).Client(t)
	a := lazySeller(t, client)
	b := lazySeller(t, client)
	if a.seat.Index() == b.seat.Index() {
		t.Fatalf("both sellers hold seat %d", a.seat.Index())
	}
	// A gone process's seat, under a lease of the test's: a home named to
	// an owner nobody is.
	lease, err := client.Grant(t.Context(), 60)
	if err != nil {
		t.Fatal(err)
	}
	ghost := max(a.seat.Index(), b.seat.Index()) + 1
	if _, err := client.Put(t.Context(), a.keys.SellersPrefix()+strconv.Itoa(ghost), "abcdef123", clientv3.WithLease(lease.ID)); err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	const sku, total = "together", 120
	if _, err := a.CreateSKU(ctx, sku, SKUConfig{Total: total, Segments: 4, InitialFill: total}); err != nil {
		t.Fatal(err)
	}
	named := 0
	for i := range 4 {
		if c, _ := counterOf(t, a, sku, i); c.Owner != 0 {
			named++
		}
	}
	if named != 3 {
		t.Fatalf("%d homes named; want 3 (two sellers and the gone one)", named)
	}
	var served, refused atomic.Int64
	var wg sync.WaitGroup
	for g := range 16 {
		e := []*Engine{a, b}[g%2]
		wg.Go(func() {
			for i := 0; ; i++ {
				_, err := e.Allocate(ctx, sku, fmt.Sprintf("g%d-%d", g, i), 1, "")
				var short *InsufficientStockError
				switch {
				case errors.As(err, &short):
					refused.Add(1)
					return
				case err != nil:
					t.Error(err)
					return
				}
				served.Add(1)
			}
		})
	}
	wg.Wait()
	if served.Load() != total {
		t.Fatalf("served %d orders of %d units (%d goroutines refused)", served.Load(), total, refused.Load())
	}
	for _, e := range []*Engine{a, b} {
		if r, err := e.Audit(ctx, sku); err != nil || !r.OK || r.Allocated != total {
			t.Fatalf("audit: %+v, %v", r, err)
		}
	}
}

// A seller's first order sells from its born home without reading it
// (bornInto), on a guess its first commit proves: the counter's
// ModRevision (the meta record's) and its value (which owner the fill
// named). Where the guess is wrong the commit is refused, nothing is
// written, and the order climbs the ladder; every unit is sold once.
//   - shared home: with one segment, two sellers' homes are the same, and
//     the fill named the lower seat's; the higher one guesses it is its
//     own (the value's compare alone tells them apart).
//   - written since: the home's counter was written after the creation
//     (5 of its units moved to the pool), at another ModRevision.
func TestBornHomeGuessedWrong(t *testing.T) {
	for _, tc := range []struct {
		name     string
		segments int
		after    func(t *testing.T, client *clientv3.Client, low, high *Engine, sku string)
	}{
		{name: "shared home", segments: 1},
		{name: "written since", segments: 4, after: func(t *testing.T, client *clientv3.Client, low, high *Engine, sku string) {
			home := seats.Home(sku, high.seat.Index(), 4)
			c, _ := counterOf(t, high, sku, home)
			if c.Owner != high.owner {
				t.Fatalf("the higher seat's home %d was born %+v, not named to it", home, c)
			}
			c.N -= 5
			if _, err := client.Txn(t.Context()).Then(
				clientv3.OpPut(high.keys.Segment(sku, home), EncodeSegmentCounter(c)),
				clientv3.OpPut(high.keys.Pool(sku), EncodeCounter(5))).Commit(); err != nil {
				t.Fatal(err)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			client := etcdtest.NewSingle(t, etcdtest.WithNoFsync()).Client(t)
			low, high := lazySeller(t, client), lazySeller(t, client)
			if low.seat.Index() > high.seat.Index() {
				low, high = high, low
			}
			ctx := t.Context()
			const sku, total = "guess", 100
			if _, err := low.CreateSKU(ctx, sku, SKUConfig{Total: total, Segments: tc.segments, InitialFill: total}); err != nil {
				t.Fatal(err)
			}
			if tc.after != nil {
				tc.after(t, client, low, high, sku)
			}
			from := etcdRev(t, high)
			if _, err := high.Allocate(ctx, sku, "first", 1, ""); err != nil {
				t.Fatalf("the first order after a wrong guess: %v", err)
			}
			if high.bornSeeded.Load() != 1 {
				t.Fatalf("%d places seeded as born homes; want the guess tried once", high.bornSeeded.Load())
			}
			if keys := etcdtest.KeysPut(t, client, high.keys.Prefix(), from, etcdRev(t, high)); len(keys) < 2 {
				// Its record, and the counter its takeover or claim wrote:
				// not a lazy sale on the guess.
				t.Fatalf("the first order wrote %v; want a counter written besides its record", keys)
			}
			served := atomic.Int64{}
			served.Add(1)
			var wg sync.WaitGroup
			for g := range 8 {
				e := []*Engine{low, high}[g%2]
				wg.Go(func() {
					for i := 0; ; i++ {
						_, err := e.Allocate(ctx, sku, fmt.Sprintf("g%d-%d", g, i), 1, "")
						var short *InsufficientStockError
						switch {
						case errors.As(err, &short):
							return
						case err != nil:
							t.Error(err)
							return
						}
						served.Add(1)
					}
				})
			}
			wg.Wait()
			if served.Load() != total {
				t.Fatalf("served %d orders of %d units", served.Load(), total)
			}
			if r, err := low.Audit(ctx, sku); err != nil || !r.OK || r.Allocated != total {
				t.Fatalf("audit: %+v, %v", r, err)
			}
		})
	}
}

// A seller whose view of a SKU is stale (it was deleted and created again,
// with the same config, since the seller read it) guesses its born home
// at the old incarnation's revision: the commit is refused, writes
// nothing, and the order fails as a request under a replaced SKU does;
// its retry is served under the new one.
func TestBornHomeUnderAStaleView(t *testing.T) {
	client := etcdtest.NewSingle(t, etcdtest.WithNoFsync()).Client(t)
	seller := lazySeller(t, client)
	maker := etcdEngine(t, func(c *engineTestConfig) { c.client = client })
	ctx := t.Context()
	const sku = "stale"
	cfg := SKUConfig{Total: 40, Segments: 4, InitialFill: 40}
	if _, err := maker.CreateSKU(ctx, sku, cfg); err != nil {
		t.Fatal(err)
	}
	if _, err := seller.sku(ctx, sku); err != nil { // the view, cached
		t.Fatal(err)
	}
	if _, err := maker.DeleteSKU(ctx, sku); err != nil {
		t.Fatal(err)
	}
	if _, err := maker.CreateSKU(ctx, sku, cfg); err != nil {
		t.Fatal(err)
	}
	from := etcdRev(t, seller)
	_, err := seller.Allocate(ctx, sku, "o", 1, "")
	if !errors.Is(err, ErrConflict) {
		t.Fatalf("the order under the stale view: %v; want ErrConflict (the SKU was replaced)", err)
	}
	if keys := etcdtest.KeysPut(t, client, seller.keys.Prefix(), from, etcdRev(t, seller)); len(keys) != 0 {
		t.Fatalf("the refused order wrote %v", keys)
	}
	if seller.bornSeeded.Load() != 1 {
		t.Fatalf("%d places seeded as born homes; want the stale guess tried", seller.bornSeeded.Load())
	}
	if _, err := seller.Allocate(ctx, sku, "o", 1, ""); err != nil {
		t.Fatalf("the retry: %v", err)
	}
	if r, err := maker.Audit(ctx, sku); err != nil || !r.OK || r.Allocated != 1 {
		t.Fatalf("audit: %+v, %v", r, err)
	}
}

// SettleOwned writes a born home seeded but not yet sold from only if it
// is the seller's (its value compared): where the fill named another
// seller, which has sold from it lazily, writing the seeded fill would
// bring back the units it sold.
func TestSettleOwnedComparesABornHome(t *testing.T) {
	client := etcdtest.NewSingle(t, etcdtest.WithNoFsync()).Client(t)
	low, high := lazySeller(t, client), lazySeller(t, client)
	if low.seat.Index() > high.seat.Index() {
		low, high = high, low
	}
	ctx := t.Context()
	const sku, fill = "settle", 10
	if _, err := low.CreateSKU(ctx, sku, SKUConfig{Total: fill, Segments: 1, InitialFill: fill}); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		if _, err := low.Allocate(ctx, sku, fmt.Sprint("o", i), 1, ""); err != nil {
			t.Fatal(err)
		}
	}
	info, err := high.sku(ctx, sku)
	if err != nil {
		t.Fatal(err)
	}
	s, err := high.seller(info)
	if err != nil {
		t.Fatal(err)
	}
	<-s.viewed
	defer s.release()
	high.seat.Start()
	if !s.bornInto(&allocReq{sku: info, order: "x", qty: 1}, 0) {
		t.Fatal("the higher seat did not guess segment 0 its born home")
	}
	if n, err := high.SettleOwned(ctx); err != nil || n != 0 {
		t.Fatalf("SettleOwned of a home named to another seller: wrote %d, %v; want 0", n, err)
	}
	if n, err := low.SettleOwned(ctx); err != nil || n != 1 {
		t.Fatalf("SettleOwned of the seller's own born home: wrote %d, %v; want 1", n, err)
	}
	if c, _ := counterOf(t, low, sku, 0); c != (SegmentCounter{N: fill - 3}) {
		t.Fatalf("the settled counter: %+v; want %d units, no owner", c, fill-3)
	}
	if r, err := low.Audit(ctx, sku); err != nil || !r.OK || r.Allocated != 3 {
		t.Fatalf("audit: %+v, %v", r, err)
	}
}

// A creation whose whole fill fits one transaction completes in it: the
// completed meta record keeps the fill, at the revision of every counter
// as born, which is what a seller's first order takes as its born home's
// fence (bornInto). A fill over several transactions, and any later write
// of the record (a restock, a policy change), leave the record without
// it, so that no seller takes its revision for the counters'.
func TestCreationDatesTheBornCounters(t *testing.T) {
	client := etcdtest.NewSingle(t, etcdtest.WithNoFsync()).Client(t)
	e := lazySeller(t, client)
	ctx := t.Context()
	meta := func(sku string) (Meta, int64) {
		t.Helper()
		resp, err := client.Get(ctx, e.keys.Meta(sku))
		if err != nil || len(resp.Kvs) != 1 {
			t.Fatalf("read the meta record of %s: %v", sku, err)
		}
		m, err := DecodeMeta(string(resp.Kvs[0].Key), resp.Kvs[0].Value)
		if err != nil {
			t.Fatal(err)
		}
		return m, resp.Kvs[0].ModRevision
	}
	for _, tc := range []struct {
		name      string
		segments  int
		fill      int64
		dated     bool // the record keeps the fill, at the counters' revision
		afterward func(sku string)
	}{
		{name: "one transaction", segments: 8, fill: 80, dated: true},
		{name: "several transactions", segments: 200, fill: 400}, // 126 counters a transaction
		{name: "no fill", segments: 8, fill: 0},
		{name: "restocked", segments: 8, fill: 80, afterward: func(sku string) {
			if _, err := e.Restock(ctx, sku, "d1", 5); err != nil {
				t.Fatal(err)
			}
		}},
		{name: "policy changed", segments: 8, fill: 80, afterward: func(sku string) {
			if _, err := e.SetPolicy(ctx, sku, 3, -1); err != nil {
				t.Fatal(err)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sku := "dated-" + strings.ReplaceAll(tc.name, " ", "-")
			if _, err := e.CreateSKU(ctx, sku, SKUConfig{Total: 1000, Segments: tc.segments, InitialFill: tc.fill}); err != nil {
				t.Fatal(err)
			}
			if tc.afterward != nil {
				tc.afterward(sku)
			}
			m, metaMod := meta(sku)
			if m.Creating {
				t.Fatalf("the record says the creation is under way: %+v", m)
			}
			if want := map[bool]int64{true: tc.fill}[tc.dated]; m.InitialFill != want {
				t.Fatalf("the completed record keeps a fill of %d; want %d", m.InitialFill, want)
			}
			if !tc.dated {
				return
			}
			for i := range tc.segments {
				if _, mod := counterOf(t, e, sku, i); mod != metaMod {
					t.Fatalf("segment %d's counter at revision %d, the record at %d", i, mod, metaMod)
				}
			}
			info, err := e.sku(ctx, sku)
			if err != nil || info.fill != tc.fill || info.filledAt != metaMod {
				t.Fatalf("the engine's view: fill %d at %d, %v; want %d at %d", info.fill, info.filledAt, err, tc.fill, metaMod)
			}
		})
	}
}
