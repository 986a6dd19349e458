package coordinator_test

import (
	"testing"
	"time"

	"github.com/stockctl/stockctl/coordinator"
	"github.com/stockctl/stockctl/internal/engines"
	"github.com/stockctl/stockctl/internal/etcdtest"
)

// Orders placed by a stockctl older than the one-key write path left a
// global orderid/<id> claim beside their record. This version reads only
// records: such an order's retry replays, a new order with its ID on
// another SKU is a new order, and prune archives it and deletes its old
// claim.
func TestOrdersWithLegacyClaims(t *testing.T) {
	etcd := etcdtest.NewSingle(t, etcdtest.WithNoFsync())
	c := newCoordinators(t, etcd, 1)[0]
	raw := etcd.Client(t)
	ctx := t.Context()
	k := engines.Of(c).Keys
	mustCreate(t, c, "old", coordinator.SKUConfig{Total: 10, Segments: 2, InitialFill: 10})
	mustCreate(t, c, "new", coordinator.SKUConfig{Total: 10, Segments: 2, InitialFill: 10})
	if _, err := c.Allocate(ctx, "old", "o-1", 2, ""); err != nil {
		t.Fatal(err)
	}
	// The claim the older version wrote in the same transaction.
	if _, err := raw.Put(ctx, k.OrderID("o-1"), "old"); err != nil {
		t.Fatal(err)
	}
	if a, err := c.Allocate(ctx, "old", "o-1", 2, ""); err != nil || !a.Replayed {
		t.Fatalf("retry of an order with a legacy claim: %+v, %v; want a replay", a, err)
	}
	if a, err := c.Allocate(ctx, "new", "o-1", 1, ""); err != nil || a.Replayed {
		t.Fatalf("its ID on another SKU: %+v, %v; want a new order", a, err)
	}
	p, err := c.Prune(ctx, "old", time.Now().Add(time.Hour))
	if err != nil || p.Orders != 1 {
		t.Fatalf("prune: %+v, %v; want 1 order archived", p, err)
	}
	if n := countKeys(t, raw, k.OrderID("o-1")); n != 0 {
		t.Fatal("prune left the order's legacy claim")
	}
	mustAudit(t, c, "old")
	mustAudit(t, c, "new")
}
