package coordinator_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stockctl/stockctl/coordinator"
	"github.com/stockctl/stockctl/internal/etcdtest"
)

// Against a member that answers every deadline-carrying call as etcd 3.4
// does when the deadline runs out (its own "context deadline exceeded",
// arriving before the client's ctx is done), the end of a wait budget and
// of the caller's ctx must still read as what they are: ErrLocked for a
// TryLock budget, the caller's cause for its ctx, and, for an allocation
// whose home segment stays busy, a fallback to another place rather than an
// rpc error. (Issue 12: 4 of 1,280 `stockctl allocate` processes failed so
// against a real etcd 3.4.23.)
func TestBudgetsAgainstServerExpiry(t *testing.T) {
	exp := etcdtest.NewExpiry34(5 * time.Millisecond)
	etcd := etcdtest.NewSingle(t, etcdtest.WithNoFsync(), exp.Option())
	cs := newCoordinators(t, etcd, 2, coordinator.WithWaitBudgets(100*time.Millisecond, 20*time.Millisecond))
	holder, other := cs[0], cs[1]
	ctx := t.Context()

	l, err := holder.Lock(ctx, "busy")
	if err != nil {
		t.Fatal(err)
	}
	t.Run("TryLock budget", func(t *testing.T) {
		for i := range 5 {
			if _, err := other.Lock(ctx, "busy", coordinator.TryFor(50*time.Millisecond)); !errors.Is(err, coordinator.ErrLocked) {
				t.Fatalf("attempt %d: TryLock of a held lock: %v, want ErrLocked", i, err)
			}
		}
	})
	t.Run("caller deadline", func(t *testing.T) {
		cause := errors.New("caller gave up")
		cctx, cancel := context.WithTimeoutCause(ctx, 100*time.Millisecond, cause)
		defer cancel()
		if _, err := other.Lock(cctx, "busy"); !errors.Is(err, cause) {
			t.Fatalf("Lock under a caller deadline: %v, want %v", err, cause)
		}
	})
	if err := l.Unlock(ctx); err != nil {
		t.Fatal(err)
	}

	t.Run("allocation falls back", func(t *testing.T) {
		const sku = "budget"
		if _, err := holder.CreateSKU(ctx, sku, coordinator.SKUConfig{Total: 100, Segments: 2, InitialFill: 100}); err != nil {
			t.Fatal(err)
		}
		// Hold segment 0 through a long step, so that orders routed there
		// spend their home budget and must fall back to segment 1.
		key := routeKeyFor(t, 2, 0)
		release := make(chan struct{})
		held := make(chan struct{})
		var wg sync.WaitGroup
		wg.Go(func() {
			_, err := holder.AllocateFunc(ctx, sku, "holder", 1, key, func(context.Context) error {
				close(held)
				<-release
				return nil
			})
			if err != nil {
				t.Errorf("holder: %v", err)
			}
		})
		<-held
		for i := range 5 {
			// The caller's ctx has a deadline too: it must never reach the server.
			actx, cancel := context.WithTimeout(ctx, 10*time.Second)
			a, err := other.Allocate(actx, sku, fmt.Sprintf("o-%d", i), 1, key)
			cancel()
			if err != nil {
				t.Fatalf("order %d: %v", i, err)
			}
			if p := a.Parts[0].Place; !p.IsPool() && p.Index() == 0 {
				t.Fatalf("order %d served from the busy segment 0", i)
			}
		}
		close(release)
		wg.Wait()
	})
	if n := exp.WithDeadline(); n != 0 {
		t.Errorf("%d calls reached the server with a deadline", n)
	}
}
