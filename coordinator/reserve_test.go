package coordinator_test

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/stockctl/stockctl/coordinator"
	"github.com/stockctl/stockctl/internal/engines"
	"github.com/stockctl/stockctl/internal/etcdtest"
	"github.com/stockctl/stockctl/segments"
)

// stateKeys is every key stockctl keeps about stock, orders, reservations
// and buyers, with its value and ModRevision: lock keys are left out (a
// failed call may have taken and kept a segment's lock, which changes no
// stock).
func stateKeys(t *testing.T, cli *clientv3.Client) map[string]string {
	t.Helper()
	resp, err := cli.Get(t.Context(), coordinator.DefaultPrefix, clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, kv := range resp.Kvs {
		// Lock keys and direct seller seats are the process's, not the
		// stock's.
		if strings.HasPrefix(string(kv.Key), coordinator.DefaultPrefix+"stocklocks/") ||
			strings.HasPrefix(string(kv.Key), coordinator.DefaultPrefix+"sellers/") {
			continue
		}
		out[string(kv.Key)] = fmt.Sprintf("%s@%d", kv.Value, kv.ModRevision)
	}
	return out
}

func sameKeys(t *testing.T, what string, before, after map[string]string) {
	t.Helper()
	for k, v := range after {
		if before[k] != v {
			t.Errorf("%s changed %s: %q -> %q", what, k, before[k], v)
		}
	}
	for k := range before {
		if _, ok := after[k]; !ok {
			t.Errorf("%s deleted %s", what, k)
		}
	}
}

// Invariants of the reservation lifecycle, each step on real etcd:
//   - Reserve takes the units (status: allocated and reserved) and a retry
//     replays it; Confirm makes it final (reserved falls, allocated stays),
//     and a second Confirm replays;
//   - Cancel returns the units of a live reservation, again reports nothing
//     returned; Cancel after Confirm is ErrConflict; Release of a confirmed
//     reservation returns its units;
//   - the books balance after every step.
func TestReservationLifecycle(t *testing.T) {
	etcd := etcdtest.NewSingle(t, etcdtest.WithNoFsync())
	c := newCoordinators(t, etcd, 1)[0]
	ctx := t.Context()
	mustCreate(t, c, "tee", coordinator.SKUConfig{Total: 20, Segments: 2, InitialFill: 20})

	a, err := c.Reserve(ctx, "tee", "r-1", 3, "k", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if a.State != segments.StateReserved || a.Deadline.IsZero() || a.Replayed {
		t.Fatalf("reserve: %+v", a)
	}
	if st := mustStatus(t, c, "tee"); st.Allocated != 3 || st.Reserved != 3 || st.Reservations != 1 {
		t.Fatalf("after reserve: allocated %d reserved %d (%d), want 3, 3 (1)", st.Allocated, st.Reserved, st.Reservations)
	}
	again, err := c.Reserve(ctx, "tee", "r-1", 3, "k", time.Minute)
	if err != nil || !again.Replayed || !again.Deadline.Equal(a.Deadline) {
		t.Fatalf("reserve retry: %+v, %v (want the first deadline %v)", again, err, a.Deadline)
	}
	conf, err := c.Confirm(ctx, "tee", "r-1")
	if err != nil || conf.Replayed {
		t.Fatalf("confirm: %+v, %v", conf, err)
	}
	if conf2, err := c.Confirm(ctx, "tee", "r-1"); err != nil || !conf2.Replayed || conf2.Revision != conf.Revision {
		t.Fatalf("confirm again: %+v, %v", conf2, err)
	}
	if st := mustStatus(t, c, "tee"); st.Allocated != 3 || st.Reserved != 0 {
		t.Fatalf("after confirm: allocated %d reserved %d, want 3, 0", st.Allocated, st.Reserved)
	}
	if _, err := c.Cancel(ctx, "tee", "r-1"); !errors.Is(err, coordinator.ErrConflict) {
		t.Fatalf("cancel after confirm: %v, want ErrConflict", err)
	}
	rep := mustAudit(t, c, "tee")
	if rep.Confirmed != 3 || rep.Reserved != 0 {
		t.Fatalf("audit: confirmed %d reserved %d", rep.Confirmed, rep.Reserved)
	}

	if _, err := c.Reserve(ctx, "tee", "r-2", 4, "", time.Hour); err != nil {
		t.Fatal(err)
	}
	x, err := c.Cancel(ctx, "tee", "r-2")
	if err != nil || !x.Released {
		t.Fatalf("cancel: %+v, %v", x, err)
	}
	if x2, err := c.Cancel(ctx, "tee", "r-2"); err != nil || x2.Released {
		t.Fatalf("cancel again: %+v, %v (want Released false)", x2, err)
	}
	if _, err := c.Confirm(ctx, "tee", "r-2"); !errors.Is(err, coordinator.ErrConflict) {
		t.Fatalf("confirm of a cancelled reservation: %v, want ErrConflict", err)
	}
	if r, err := c.Release(ctx, "tee", "r-1"); err != nil || !r.Released {
		t.Fatalf("release of a confirmed reservation: %+v, %v", r, err)
	}
	if st := mustStatus(t, c, "tee"); st.Allocated != 0 || st.Remaining() != 20 {
		t.Fatalf("at the end: allocated %d remaining %d", st.Allocated, st.Remaining())
	}
	mustAudit(t, c, "tee")
}

// Every bad input is a clear error that changes no stock, order,
// reservation or buyer key.
func TestReservationBadInputChangesNothing(t *testing.T) {
	etcd := etcdtest.NewSingle(t, etcdtest.WithNoFsync())
	c := newCoordinators(t, etcd, 1)[0]
	raw := etcd.Client(t)
	ctx := t.Context()
	mustCreate(t, c, "tee", coordinator.SKUConfig{Total: 20, Segments: 2, InitialFill: 20})
	mustCreate(t, c, "capped", coordinator.SKUConfig{Total: 20, Segments: 2, InitialFill: 20, PerUserLimit: 2})
	if _, err := c.Allocate(ctx, "tee", "plain", 1, ""); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Reserve(ctx, "tee", "cancelled", 1, "", time.Hour); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Cancel(ctx, "tee", "cancelled"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Reserve(ctx, "tee", "live", 2, "", time.Hour, coordinator.WithBuyer("bob")); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Allocate(ctx, "capped", "capped-1", 2, "", coordinator.WithBuyer("amy")); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Reserve(ctx, "tee", "released", 1, "", time.Hour); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Release(ctx, "tee", "released"); err != nil {
		t.Fatal(err)
	}

	cases := []struct {
		name string
		call func() error
		want error
	}{
		{"ttl zero", func() error { _, err := c.Reserve(ctx, "tee", "n1", 1, "", 0); return err }, coordinator.ErrInvalidArgument},
		{"ttl negative", func() error { _, err := c.Reserve(ctx, "tee", "n2", 1, "", -time.Second); return err }, coordinator.ErrInvalidArgument},
		{"ttl above the maximum", func() error {
			_, err := c.Reserve(ctx, "tee", "n3", 1, "", segments.MaxReservationTTL+time.Nanosecond)
			return err
		}, coordinator.ErrInvalidArgument},
		{"huge ttl", func() error { _, err := c.Reserve(ctx, "tee", "n4", 1, "", 1<<62); return err }, coordinator.ErrInvalidArgument},
		{"qty zero", func() error { _, err := c.Reserve(ctx, "tee", "n5", 0, "", time.Hour); return err }, coordinator.ErrInvalidArgument},
		{"unknown SKU", func() error { _, err := c.Reserve(ctx, "nope", "n6", 1, "", time.Hour); return err }, coordinator.ErrUnknownSKU},
		{"confirm unknown order", func() error { _, err := c.Confirm(ctx, "tee", "ghost"); return err }, coordinator.ErrOrderNotFound},
		{"cancel unknown order", func() error { _, err := c.Cancel(ctx, "tee", "ghost"); return err }, coordinator.ErrOrderNotFound},
		{"confirm a released reservation", func() error { _, err := c.Confirm(ctx, "tee", "released"); return err }, coordinator.ErrConflict},
		{"confirm a cancelled reservation", func() error { _, err := c.Confirm(ctx, "tee", "cancelled"); return err }, coordinator.ErrConflict},
		{"confirm a plain allocation", func() error { _, err := c.Confirm(ctx, "tee", "plain"); return err }, coordinator.ErrConflict},
		{"cancel a plain allocation", func() error { _, err := c.Cancel(ctx, "tee", "plain"); return err }, coordinator.ErrConflict},
		{"confirm with a bad order ID", func() error { _, err := c.Confirm(ctx, "tee", "a/b"); return err }, coordinator.ErrInvalidArgument},
		{"reserve the ID of a plain allocation", func() error { _, err := c.Reserve(ctx, "tee", "plain", 1, "", time.Hour); return err }, coordinator.ErrConflict},
		{"allocate the ID of a reservation", func() error {
			_, err := c.Allocate(ctx, "tee", "live", 2, "", coordinator.WithBuyer("bob"))
			return err
		}, coordinator.ErrConflict},
		{"reserve again for another buyer", func() error {
			_, err := c.Reserve(ctx, "tee", "live", 2, "", time.Hour, coordinator.WithBuyer("eve"))
			return err
		}, coordinator.ErrConflict},
		{"missing buyer on a limited SKU", func() error { _, err := c.Allocate(ctx, "capped", "n7", 1, ""); return err }, coordinator.ErrInvalidArgument},
		{"missing buyer on a limited SKU (reserve)", func() error { _, err := c.Reserve(ctx, "capped", "n8", 1, "", time.Hour); return err }, coordinator.ErrInvalidArgument},
		{"buyer with a slash", func() error {
			_, err := c.Allocate(ctx, "capped", "n9", 1, "", coordinator.WithBuyer("a/b"))
			return err
		}, coordinator.ErrInvalidArgument},
		{"buyer with a space", func() error {
			_, err := c.Reserve(ctx, "tee", "n10", 1, "", time.Hour, coordinator.WithBuyer("a b"))
			return err
		}, coordinator.ErrInvalidArgument},
		{"buyer too long", func() error {
			_, err := c.Reserve(ctx, "tee", "n11", 1, "", time.Hour, coordinator.WithBuyer(strings.Repeat("b", segments.MaxBuyerLen+1)))
			return err
		}, coordinator.ErrInvalidArgument},
		{"qty above the limit alone", func() error {
			_, err := c.Allocate(ctx, "capped", "n12", 3, "", coordinator.WithBuyer("zed"))
			return err
		}, coordinator.ErrLimitExceeded},
		{"an applied order's ID again, with a qty above the limit alone", func() error {
			// The ID's first use says more than the limit: ErrConflict.
			_, err := c.Allocate(ctx, "capped", "capped-1", 3, "", coordinator.WithBuyer("amy"))
			if errors.Is(err, coordinator.ErrLimitExceeded) {
				return fmt.Errorf("want a conflict, not %w", err)
			}
			return err
		}, coordinator.ErrConflict},
		{"buyer at the limit", func() error {
			_, err := c.Reserve(ctx, "capped", "n13", 1, "", time.Hour, coordinator.WithBuyer("amy"))
			return err
		}, coordinator.ErrLimitExceeded},
		{"negative per-user limit", func() error {
			_, err := c.CreateSKU(ctx, "neg", coordinator.SKUConfig{Total: 1, Segments: 1, PerUserLimit: -1})
			return err
		}, coordinator.ErrInvalidArgument},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			before := stateKeys(t, raw)
			err := tc.call()
			if !errors.Is(err, tc.want) {
				t.Fatalf("got %v, want %v", err, tc.want)
			}
			if err.Error() == "" || !strings.Contains(err.Error(), ":") {
				t.Fatalf("error %q does not say what was wrong", err)
			}
			sameKeys(t, tc.name, before, stateKeys(t, raw))
		})
	}
	mustAudit(t, c, "tee")
	mustAudit(t, c, "capped")
}

// Invariant: a Confirm racing the expiry of the same reservation is decided
// by one etcd compare: exactly one wins. Either the order ends confirmed
// (Confirm succeeded, the sweep expired nothing of it) or expired (the sweep
// returned it, Confirm said ErrExpired); never both, never neither. The
// sweep is driven with a clock an hour ahead, so the reservation is due for
// it and not for Confirm. The books balance after every round.
func TestConfirmRacesExpiry(t *testing.T) {
	etcd := etcdtest.NewSingle(t, etcdtest.WithNoFsync())
	cs := newCoordinators(t, etcd, 2)
	ctx := t.Context()
	mustCreate(t, cs[0], "race", coordinator.SKUConfig{Total: 1000, Segments: 4, InitialFill: 1000, PerUserLimit: 1000})
	const rounds, per = 20, 5
	var confirmedWins, expiredWins int
	for round := range rounds {
		ids := make([]string, per)
		for i := range ids {
			ids[i] = fmt.Sprintf("race-%d-%d", round, i)
			if _, err := cs[0].Reserve(ctx, "race", ids[i], 1, ids[i], time.Hour, coordinator.WithBuyer("b")); err != nil {
				t.Fatal(err)
			}
		}
		confirmErr := make([]error, per)
		var expired []segments.Expiry
		var sweepErr error
		var wg sync.WaitGroup
		wg.Go(func() {
			expired, sweepErr = engines.Of(cs[1]).Stock.ExpireDue(ctx, "race", time.Now().Add(2*time.Hour), 100)
		})
		for i := range ids {
			// Spread the confirms over the sweep's reads and commits, so
			// that both orders of the race happen.
			delay := time.Duration(rand.IntN(4000)) * time.Microsecond
			wg.Go(func() {
				time.Sleep(delay)
				_, confirmErr[i] = cs[0].Confirm(ctx, "race", ids[i])
			})
		}
		wg.Wait()
		if sweepErr != nil {
			t.Fatal(sweepErr)
		}
		byID := map[string]bool{}
		for _, x := range expired {
			if byID[x.Order] {
				t.Fatalf("round %d: %s expired twice", round, x.Order)
			}
			byID[x.Order] = true
		}
		for i, id := range ids {
			o := readOrder(t, cs[0], "race", id)
			switch {
			case confirmErr[i] == nil:
				confirmedWins++
				if byID[id] || o.State != segments.StateConfirmed {
					t.Fatalf("round %d: %s confirmed, but expired by the sweep %v, state %q", round, id, byID[id], o.State)
				}
			case errors.Is(confirmErr[i], coordinator.ErrExpired):
				expiredWins++
				if !byID[id] || o.State != segments.StateExpired {
					t.Fatalf("round %d: %s: confirm said expired, sweep reported %v, state %q", round, id, byID[id], o.State)
				}
			default:
				t.Fatalf("round %d: confirm %s: %v", round, id, confirmErr[i])
			}
		}
		mustAudit(t, cs[0], "race")
	}
	t.Logf("%d rounds × %d: confirm won %d, expiry won %d", rounds, per, confirmedWins, expiredWins)
}

func readOrder(t *testing.T, c *coordinator.Coordinator, sku, id string) segments.Order {
	t.Helper()
	key := engines.Of(c).Keys.Order(sku, id)
	resp, err := c.Client().Get(t.Context(), key)
	if err != nil || len(resp.Kvs) == 0 {
		t.Fatalf("read order %s: %v (%d keys)", id, err, len(resp.Kvs))
	}
	o, err := segments.DecodeOrder(key, resp.Kvs[0].Value)
	if err != nil {
		t.Fatal(err)
	}
	return o
}

// Invariant: with a per-user limit, 50 goroutines of one buyer on 4
// coordinators (4 processes' views), racing across segments with plain
// allocations and reservations, get exactly the limit in total, never
// more; every other order is ErrLimitExceeded and deducts nothing. The
// buyer's quota comes back by release, cancel and expiry, one unit each,
// and is taken again. Other buyers are not limited by this one. The audit
// checks the buyer's counter against its orders.
func TestPerUserLimitConcurrent(t *testing.T) {
	etcd := etcdtest.NewSingle(t, etcdtest.WithNoFsync())
	cs := newCoordinators(t, etcd, 4)
	ctx, cancel := etcdtest.HangContext(t)
	defer cancel()
	const limit = 5
	mustCreate(t, cs[0], "lim", coordinator.SKUConfig{Total: 400, Segments: 8, InitialFill: 300, PerUserLimit: limit})

	var got atomic.Int64
	var mu sync.Mutex
	var won []string
	var wg sync.WaitGroup
	for g := range 50 {
		wg.Go(func() {
			c := cs[g%len(cs)]
			id := fmt.Sprintf("u1-%d", g)
			route := fmt.Sprintf("route-%d", g) // spread over segments
			var err error
			if g%2 == 0 {
				_, err = c.Allocate(ctx, "lim", id, 1, route, coordinator.WithBuyer("u1"))
			} else {
				_, err = c.Reserve(ctx, "lim", id, 1, route, time.Hour, coordinator.WithBuyer("u1"))
			}
			switch {
			case err == nil:
				got.Add(1)
				mu.Lock()
				won = append(won, id)
				mu.Unlock()
			case errors.Is(err, coordinator.ErrLimitExceeded):
			default:
				t.Errorf("order %s: %v", id, err)
			}
		})
		// Other buyers at the same time: each gets its own limit.
		wg.Go(func() {
			c := cs[(g+1)%len(cs)]
			buyer := fmt.Sprintf("other-%d", g)
			if _, err := c.Allocate(ctx, "lim", fmt.Sprintf("o-%d", g), 1, "", coordinator.WithBuyer(buyer)); err != nil {
				t.Errorf("other buyer %s: %v", buyer, err)
			}
		})
	}
	wg.Wait()
	if n := got.Load(); n != limit {
		t.Fatalf("buyer u1 got %d units, want exactly the limit %d", n, limit)
	}
	rep := mustAudit(t, cs[0], "lim")
	if rep.Allocated != limit+50 {
		t.Fatalf("allocated %d, want %d", rep.Allocated, limit+50)
	}

	// Quota back by release, cancel and expiry, then taken again.
	var plain, reserved []string
	for _, id := range won {
		var n int
		fmt.Sscanf(id, "u1-%d", &n)
		if n%2 == 0 {
			plain = append(plain, id)
		} else {
			reserved = append(reserved, id)
		}
	}
	next := 0
	buyAgain := func(how string) {
		t.Helper()
		id := fmt.Sprintf("again-%d", next)
		next++
		if _, err := cs[next%4].Allocate(ctx, "lim", id, 1, "", coordinator.WithBuyer("u1")); err != nil {
			t.Fatalf("after %s: %v", how, err)
		}
		if _, err := cs[0].Allocate(ctx, "lim", id+"-over", 1, "", coordinator.WithBuyer("u1")); !errors.Is(err, coordinator.ErrLimitExceeded) {
			t.Fatalf("after %s and a new order: %v, want ErrLimitExceeded", how, err)
		}
	}
	if len(plain) > 0 {
		if _, err := cs[1].Release(ctx, "lim", plain[0]); err != nil {
			t.Fatal(err)
		}
		buyAgain("release")
	}
	if len(reserved) > 1 {
		if _, err := cs[2].Cancel(ctx, "lim", reserved[0]); err != nil {
			t.Fatal(err)
		}
		buyAgain("cancel")
		xs, err := engines.Of(cs[3]).Stock.ExpireDue(ctx, "lim", time.Now().Add(2*time.Hour), 100)
		if err != nil || len(xs) != len(reserved)-1 {
			t.Fatalf("expire: %d expired, %v; want %d", len(xs), err, len(reserved)-1)
		}
		for range xs {
			id := fmt.Sprintf("again-%d", next)
			next++
			if _, err := cs[next%4].Allocate(ctx, "lim", id, 1, "", coordinator.WithBuyer("u1")); err != nil {
				t.Fatalf("after expiry: %v", err)
			}
		}
	}
	mustAudit(t, cs[0], "lim")
}

// Invariant: Confirms are committed together (one transaction for all
// waiting in a process), yet each is decided alone: three concurrent
// Confirms of each of 30 reservations, from two coordinators, confirm each
// exactly once (one answer not replayed, the others replays of it, all
// with the same revision), while Cancels of other reservations in the same
// batches are refused nothing and the books balance.
func TestConcurrentConfirms(t *testing.T) {
	etcd := etcdtest.NewSingle(t, etcdtest.WithNoFsync())
	cs := newCoordinators(t, etcd, 2)
	ctx := t.Context()
	mustCreate(t, cs[0], "cc", coordinator.SKUConfig{Total: 200, Segments: 4, InitialFill: 200})
	const n = 30
	for i := range 2 * n {
		if _, err := cs[i%2].Reserve(ctx, "cc", fmt.Sprintf("cc-%d", i), 1, "", time.Hour); err != nil {
			t.Fatal(err)
		}
	}
	type answer struct {
		rev      int64
		replayed bool
	}
	answers := make([][]answer, n)
	var mu sync.Mutex
	var wg sync.WaitGroup
	for i := range n {
		for k := range 3 {
			wg.Go(func() {
				r, err := cs[(i+k)%2].Confirm(ctx, "cc", fmt.Sprintf("cc-%d", i))
				if err != nil {
					t.Errorf("confirm cc-%d: %v", i, err)
					return
				}
				mu.Lock()
				answers[i] = append(answers[i], answer{r.Revision, r.Replayed})
				mu.Unlock()
			})
		}
		wg.Go(func() {
			if _, err := cs[i%2].Cancel(ctx, "cc", fmt.Sprintf("cc-%d", n+i)); err != nil {
				t.Errorf("cancel cc-%d: %v", n+i, err)
			}
		})
	}
	wg.Wait()
	for i, as := range answers {
		fresh := 0
		for _, a := range as {
			if !a.replayed {
				fresh++
			}
			if a.rev != as[0].rev {
				t.Errorf("cc-%d: confirmations at revisions %v", i, as)
			}
		}
		if len(as) != 3 || fresh != 1 {
			t.Errorf("cc-%d: %d answers, %d not replayed; want 3 and 1", i, len(as), fresh)
		}
	}
	rep := mustAudit(t, cs[0], "cc")
	if rep.Confirmed != n || rep.Reserved != 0 || rep.ReleasedOrders != n {
		t.Fatalf("audit: confirmed %d reserved %d released %d", rep.Confirmed, rep.Reserved, rep.ReleasedOrders)
	}
}

// NextExpiry names the earliest deadline of a SKU's live reservations,
// and none once they are confirmed or expired; bad names are errors that
// change nothing.
func TestNextExpiry(t *testing.T) {
	etcd := etcdtest.NewSingle(t, etcdtest.WithNoFsync())
	c := newCoordinators(t, etcd, 1)[0]
	ctx := t.Context()
	mustCreate(t, c, "nx", coordinator.SKUConfig{Total: 10, Segments: 2, InitialFill: 10})
	if at, ok, err := c.NextExpiry(ctx, "nx"); err != nil || ok {
		t.Fatalf("no reservation: %v %v %v, want none", at, ok, err)
	}
	if _, err := c.Allocate(ctx, "nx", "plain", 1, ""); err != nil {
		t.Fatal(err)
	}
	if _, ok, err := c.NextExpiry(ctx, "nx"); err != nil || ok {
		t.Fatalf("a plain allocation is no reservation: %v %v", ok, err)
	}
	before := time.Now()
	late, err := c.Reserve(ctx, "nx", "r-late", 1, "", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	soon, err := c.Reserve(ctx, "nx", "r-soon", 1, "", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	at, ok, err := c.NextExpiry(ctx, "nx")
	if err != nil || !ok || !at.Equal(soon.Deadline) || at.Before(before.Add(time.Minute)) {
		t.Fatalf("two reservations: %v %v %v, want r-soon's deadline %v", at, ok, err, soon.Deadline)
	}
	if _, err := c.Confirm(ctx, "nx", "r-soon"); err != nil {
		t.Fatal(err)
	}
	if at, ok, err := c.NextExpiry(ctx, "nx"); err != nil || !ok || !at.Equal(late.Deadline) {
		t.Fatalf("r-soon confirmed: %v %v %v, want r-late's deadline %v", at, ok, err, late.Deadline)
	}
	if _, err := c.Cancel(ctx, "nx", "r-late"); err != nil {
		t.Fatal(err)
	}
	if at, ok, err := c.NextExpiry(ctx, "nx"); err != nil || ok {
		t.Fatalf("none live: %v %v %v", at, ok, err)
	}
	for _, tc := range []struct{ sku, want string }{{"no/such", "not"}, {"absent", "absent"}} {
		if _, _, err := c.NextExpiry(ctx, tc.sku); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("NextExpiry(%q): %v, want an error naming it", tc.sku, err)
		}
	}
	if _, _, err := c.NextExpiry(ctx, "absent"); !errors.Is(err, coordinator.ErrUnknownSKU) {
		t.Errorf("NextExpiry of an unknown SKU: %v, want ErrUnknownSKU", err)
	}
}

// Over several clusters NextExpiry asks the cluster that holds the SKU.
func TestNextExpiryOverClusters(t *testing.T) {
	ctx := t.Context()
	c := mustFleet(t, newTestClusters(t, "a", "b", "c"))
	skus := []string{"nx-0", "nx-1", "nx-2", "nx-3", "nx-4", "nx-5"}
	where := map[string]bool{}
	for _, sku := range skus {
		mustCreate(t, c, sku, coordinator.SKUConfig{Total: 4, Segments: 1, InitialFill: 4})
		cl, err := c.ClusterOf(ctx, sku)
		if err != nil {
			t.Fatal(err)
		}
		where[cl] = true
		r, err := c.Reserve(ctx, sku, "r-"+sku, 1, "", time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		if at, ok, err := c.NextExpiry(ctx, sku); err != nil || !ok || !at.Equal(r.Deadline) {
			t.Fatalf("%s (cluster %s): %v %v %v, want %v", sku, cl, at, ok, err, r.Deadline)
		}
	}
	if len(where) < 2 {
		t.Fatalf("every SKU in one cluster (%v): the test proves nothing", where)
	}
}
