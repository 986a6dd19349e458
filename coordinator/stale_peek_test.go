package coordinator_test

import (
	"errors"
	"testing"

	"github.com/stockctl/stockctl/coordinator"
	"github.com/stockctl/stockctl/internal/etcdtest"
)

// A process whose record of a SKU is from before the SKU was deleted and
// created again must not sell the new SKU under the old one's rules. Here
// the process read the SKU's meta record (prefetched with another SKU's)
// but never sold it, so its first order of it peeks at one segment (a read
// of the new SKU's counter, created after the process read the old meta
// record) and commits there: the commit must be fenced by the SKU's
// incarnation. The new SKU has a
// per-user limit of 1, the old one none: an order of 2 units for one buyer
// served is the old rules applied to the new stock.
func TestStaleRecordFirstOrderAfterRecreate(t *testing.T) {
	for _, lazy := range []bool{false, true} {
		name := "eager"
		if lazy {
			name = "lazy"
		}
		t.Run(name, func(t *testing.T) {
			etcd := etcdtest.NewSingle(t, etcdtest.WithNoFsync())
			var opts []coordinator.Option
			if lazy {
				opts = append(opts, coordinator.WithLazySegments())
			} else {
				opts = append(opts, coordinator.WithEagerSegments())
			}
			stale := newCoordinators(t, etcd, 1, opts...)[0]
			admin := newCoordinator(t, etcd)
			ctx := t.Context()
			mustCreate(t, admin, "other", coordinator.SKUConfig{Total: 10, Segments: 1, InitialFill: 10})
			mustCreate(t, admin, "pr", coordinator.SKUConfig{Total: 40, Segments: 4, InitialFill: 40})
			// The stale process's first order (of another SKU) reads every
			// SKU's meta record, pr's too; it sells nothing of pr.
			if _, err := stale.Allocate(ctx, "other", "x1", 1, ""); err != nil {
				t.Fatal(err)
			}
			deleteSKU(t, admin, "pr")
			mustCreate(t, admin, "pr", coordinator.SKUConfig{Total: 40, Segments: 4, InitialFill: 40, PerUserLimit: 1})

			a, err := stale.Allocate(ctx, "pr", "o1", 2, "", coordinator.WithBuyer("u"))
			if err == nil {
				t.Fatalf("2 units sold to buyer u of a SKU with a per-user limit of 1 (the old SKU's rules): %+v", a)
			}
			if !errors.Is(err, coordinator.ErrConflict) && !errors.Is(err, coordinator.ErrUnknownSKU) && !errors.Is(err, coordinator.ErrLimitExceeded) {
				t.Fatalf("o1: %v; want a conflict (the SKU changed), or the new SKU's limit", err)
			}
			if rep := mustAudit(t, admin, "pr"); rep.Allocated != 0 {
				t.Fatalf("the new SKU allocates %d units, want 0", rep.Allocated)
			}
			// Once it reads the SKU again, the process sells under its
			// rules: 1 unit to u, not 2.
			if _, err := stale.Allocate(ctx, "pr", "o2", 1, "", coordinator.WithBuyer("u")); err != nil {
				t.Fatalf("an order within the new SKU's rules: %v", err)
			}
		})
	}
}
