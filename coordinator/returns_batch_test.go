package coordinator_test

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/etcdserverpb"

	"github.com/stockctl/stockctl/coordinator"
	"github.com/stockctl/stockctl/internal/engines"
	"github.com/stockctl/stockctl/internal/etcdtest"
	"github.com/stockctl/stockctl/segments"
)

// recordPuts counts the records under prefix a write Txn puts (0 for a
// Txn with no compare: not a fenced write).
func recordPuts(prefix string) func(*etcdserverpb.TxnRequest) int64 {
	return func(txn *etcdserverpb.TxnRequest) int64 {
		n := int64(0)
		for _, op := range txn.Success {
			if put := op.GetRequestPut(); put != nil && len(txn.Compare) > 0 && strings.HasPrefix(string(put.Key), prefix) {
				n++
			}
		}
		return n
	}
}

// Invariant: Releases and Cancels racing in one process, committed
// together (segments/return_batch.go), return every order exactly once
// (two returns of one order: one reports Released, the other not), while
// another process sells (absorbing the inboxes they add to) and returns
// orders of its own; the books balance at every revision in between, the
// buyers' counters included (Audit). The returns shared transactions (one
// of them marked several records), or the test proves nothing.
func TestReturnsCommittedTogether(t *testing.T) {
	etcd := etcdtest.NewSingle(t, etcdtest.WithNoFsync())
	var count txnCounter
	a := interceptedCoordinator(t, etcd, count.intercept)
	b := newCoordinators(t, etcd, 1)[0]
	ctx := t.Context()
	const sku = "rb"
	mustCreate(t, a, sku, coordinator.SKUConfig{Total: 2000, Segments: 4, InitialFill: 600, PerUserLimit: 1000})
	buyer := func(i int) coordinator.OrderOption { return coordinator.WithBuyer(fmt.Sprint("u", i%4)) }

	// a sells 100 orders and reserves 100; b sells 60.
	const n = 100
	var sold sync.WaitGroup
	sell := func(f func() error) {
		sold.Add(1)
		go func() {
			defer sold.Done()
			if err := f(); err != nil {
				t.Error(err)
			}
		}()
	}
	for i := range n {
		sell(func() error {
			_, err := a.Allocate(ctx, sku, fmt.Sprint("a-", i), 1+int64(i%3), "", buyer(i))
			return err
		})
		sell(func() error {
			_, err := a.Reserve(ctx, sku, fmt.Sprint("r-", i), 1+int64(i%2), "", time.Hour, buyer(i))
			return err
		})
	}
	for i := range 60 {
		sell(func() error {
			_, err := b.Allocate(ctx, sku, fmt.Sprint("b-", i), 1, "", buyer(i))
			return err
		})
	}
	sold.Wait()
	if t.Failed() {
		t.FailNow()
	}
	start := mustStatus(t, a, sku).Revision

	// Every order of a returned twice at once (a reservation by a Cancel
	// and a Release), while b sells 60 more and releases its first 60.
	var txns atomic.Int64 // a's write transactions that put records
	count.arm(func(txn *etcdserverpb.TxnRequest) int64 {
		n := recordPuts(engines.Of(a).Keys.Orders(sku))(txn)
		if n > 0 {
			txns.Add(1)
		}
		return n
	})
	var released sync.Map // order → times reported Released
	var mu sync.Mutex
	var errs []error
	var wg sync.WaitGroup
	ret := func(c *coordinator.Coordinator, order string, cancel bool) {
		defer wg.Done()
		var r *coordinator.Released
		var err error
		if cancel {
			r, err = c.Cancel(ctx, sku, order)
		} else {
			r, err = c.Release(ctx, sku, order)
		}
		if err != nil {
			mu.Lock()
			errs = append(errs, fmt.Errorf("return %s: %w", order, err))
			mu.Unlock()
			return
		}
		if r.Released {
			v, _ := released.LoadOrStore(order, new(atomic.Int64))
			v.(*atomic.Int64).Add(1)
		}
	}
	for i := range n {
		wg.Add(4)
		go ret(a, fmt.Sprint("a-", i), false)
		go ret(a, fmt.Sprint("a-", i), false)
		go ret(a, fmt.Sprint("r-", i), true)
		go ret(a, fmt.Sprint("r-", i), false)
	}
	for i := range 60 {
		wg.Add(2)
		go ret(b, fmt.Sprint("b-", i), false)
		go func() {
			defer wg.Done()
			if _, err := b.Allocate(ctx, sku, fmt.Sprint("b2-", i), 1, "", buyer(i)); err != nil {
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	count.disarm()
	for _, err := range errs {
		t.Error(err)
	}
	for _, p := range []string{"a-", "r-", "b-"} {
		for i := range map[string]int{"a-": n, "r-": n, "b-": 60}[p] {
			order := p + fmt.Sprint(i)
			v, ok := released.Load(order)
			if !ok || v.(*atomic.Int64).Load() != 1 {
				got := int64(0)
				if ok {
					got = v.(*atomic.Int64).Load()
				}
				t.Errorf("order %s reported released %d times; want once", order, got)
			}
		}
	}
	if most := count.most.Load(); most < 2 {
		t.Fatalf("a's returns went one record a transaction (%d transactions): the test proves nothing", txns.Load())
	}
	t.Logf("a's %d returns: %d write transactions, at most %d records in one", 2*n, txns.Load(), count.most.Load())

	// The books, at every revision since the returns began.
	end := mustAudit(t, a, sku)
	if end.Allocated != 60 {
		t.Errorf("audit: %d units allocated; want 60 (b's second orders)", end.Allocated)
	}
	for rev := start; rev <= end.Revision; rev++ {
		rep, err := a.AuditAt(ctx, sku, rev)
		if err != nil {
			t.Fatalf("audit at %d: %v", rev, err)
		}
		if !rep.OK {
			t.Fatalf("audit at revision %d: %v", rev, rep.Problems)
		}
	}
}

// Invariant: a return whose order another process changes after the
// returner read it, just before the returner's transaction is sent, is
// refused by the record's compare and reads the order again: returned by
// the other, it answers "already released" (the order goes back once);
// confirmed by the other, a Cancel is ErrConflict and a Release returns
// the paid order (its record confirmed and released). The other return of
// its transaction is sent again and lands. A Confirm changes no counter, so
// only the record's compare can see it.
func TestReturnRacesChangeAtCommit(t *testing.T) {
	for _, tc := range []struct {
		winner, loser string // "release", "cancel" or "confirm"
		want          string // "released false", "conflict", "released confirmed"
	}{
		{"release", "release", "released false"},
		{"cancel", "cancel", "released false"},
		{"cancel", "release", "released false"},
		{"confirm", "cancel", "conflict"},
		{"confirm", "release", "released confirmed"},
	} {
		t.Run(tc.loser+" after "+tc.winner, func(t *testing.T) {
			etcd := etcdtest.NewSingle(t, etcdtest.WithNoFsync())
			var hook beforeTxn
			a := interceptedCoordinator(t, etcd, hook.intercept)
			b := newCoordinators(t, etcd, 1)[0]
			ctx := t.Context()
			mustCreate(t, b, "w", coordinator.SKUConfig{Total: 100, Segments: 2, InitialFill: 100, PerUserLimit: 10})
			for _, o := range []string{"o1", "o2"} {
				if _, err := b.Reserve(ctx, "w", o, 2, "", time.Hour, coordinator.WithBuyer("amy")); err != nil {
					t.Fatal(err)
				}
			}
			do := func(c *coordinator.Coordinator, how, order string) (*coordinator.Released, error) {
				switch how {
				case "cancel":
					return c.Cancel(ctx, "w", order)
				case "confirm":
					_, err := c.Confirm(ctx, "w", order)
					return &coordinator.Released{Released: true}, err
				}
				return c.Release(ctx, "w", order)
			}
			var winErr error
			hook.armWrite(engines.Of(a).Keys.Order("w", "o1"), func() {
				var r *coordinator.Released
				r, winErr = do(b, tc.winner, "o1")
				if winErr == nil && !r.Released {
					winErr = fmt.Errorf("the first %s reported released false", tc.winner)
				}
			})
			r, err := do(a, tc.loser, "o1")
			if hook.fired.Load() != 1 {
				t.Fatal("the interceptor never ran the other call: the test proves nothing")
			}
			if winErr != nil {
				t.Fatal(winErr)
			}
			switch tc.want {
			case "conflict":
				if !errors.Is(err, coordinator.ErrConflict) {
					t.Fatalf("%s racing a %s at its commit: %+v, %v; want ErrConflict", tc.loser, tc.winner, r, err)
				}
			case "released false":
				if err != nil || r.Released {
					t.Fatalf("%s racing a %s at its commit: %+v, %v; want released false (once only)", tc.loser, tc.winner, r, err)
				}
			case "released confirmed":
				if err != nil || !r.Released || r.State != segments.StateConfirmed {
					t.Fatalf("%s racing a %s at its commit: %+v, %v; want released, confirmed", tc.loser, tc.winner, r, err)
				}
			}
			if r2, err := do(a, tc.loser, "o2"); err != nil || !r2.Released {
				t.Fatalf("the other order's %s: %+v, %v", tc.loser, r2, err)
			}
			want := int64(0)
			if tc.want == "conflict" {
				want = 2 // o1, confirmed
			}
			if rep := mustAudit(t, b, "w"); rep.Allocated != want {
				t.Fatalf("audit: %d units allocated; want %d", rep.Allocated, want)
			}
		})
	}
}
