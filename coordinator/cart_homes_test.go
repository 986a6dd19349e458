package coordinator_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	"google.golang.org/grpc"

	"github.com/stockctl/stockctl/coordinator"
	"github.com/stockctl/stockctl/internal/engines"
	"github.com/stockctl/stockctl/internal/etcdtest"
)

// stockPrefixReads counts the read requests that range a whole SKU's
// counters (a prefix read of stock/<sku>/).
type stockPrefixReads struct {
	prefix atomic.Pointer[string]
	n      atomic.Int64
}

func (c *stockPrefixReads) intercept(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	if txn, ok := req.(*etcdserverpb.TxnRequest); ok {
		if p := c.prefix.Load(); p != nil {
			for _, op := range txn.Success {
				if r := op.GetRequestRange(); r != nil && string(r.Key) == *p && len(r.RangeEnd) > 0 {
					c.n.Add(1)
				}
			}
		}
	}
	return invoker(ctx, method, req, reply, cc, opts...)
}

// A cart whose every line its home segment can serve is planned on a read
// of those segments only, not of every counter of its SKUs; one that needs
// more (another segment, the pool), a replay and a refusal are decided on a
// full read, as before: served from elsewhere, replayed, refused truly. The
// books balance throughout.
func TestCartReadsHomesFirst(t *testing.T) {
	etcd := etcdtest.NewSingle(t, etcdtest.WithNoFsync())
	var reads stockPrefixReads
	c := interceptedCoordinator(t, etcd, reads.intercept)
	ctx := t.Context()
	mustCreate(t, c, "h1", coordinator.SKUConfig{Total: 1000, Segments: 4, InitialFill: 400})
	mustCreate(t, c, "h2", coordinator.SKUConfig{Total: 1000, Segments: 4, InitialFill: 400})
	prefix := engines.Of(c).Keys.SKUStock("h1")
	reads.prefix.Store(&prefix)

	small := []coordinator.Line{{SKU: "h1", Qty: 2}, {SKU: "h2", Qty: 3}}
	if _, err := c.AllocateOrder(ctx, "small", small); err != nil {
		t.Fatal(err)
	}
	if n := reads.n.Load(); n != 0 {
		t.Errorf("a cart its homes can serve read every counter of h1 %d times; want none", n)
	}

	// 150 of h1: more than a segment holds (100), so the pool or other
	// segments give the rest, found by a full read.
	big, err := c.AllocateOrder(ctx, "big", []coordinator.Line{{SKU: "h1", Qty: 150}, {SKU: "h2", Qty: 1}})
	if err != nil {
		t.Fatal(err)
	}
	if len(big.Lines[0].Parts) < 2 {
		t.Errorf("150 units from one place: %+v", big.Lines[0].Parts)
	}
	if reads.n.Load() == 0 {
		t.Error("a cart its homes cannot serve was served without a full read")
	}

	before := reads.n.Load()
	again, err := c.AllocateOrder(ctx, "small", small)
	if err != nil || !again.Replayed {
		t.Fatalf("a retry of the first cart: %+v, %v; want it replayed", again, err)
	}
	if reads.n.Load() == before {
		t.Error("a replay was answered without a full read")
	}
	_, err = c.AllocateOrder(ctx, "huge", []coordinator.Line{{SKU: "h1", Qty: 900}, {SKU: "h2", Qty: 1}})
	var le *coordinator.LineError
	if !errors.As(err, &le) || le.SKU != "h1" || !errors.Is(err, coordinator.ErrInsufficientStock) {
		t.Fatalf("900 of the 848 left: %v; want an insufficient-stock refusal of line h1", err)
	}
	if got := auditAll(t, c, "h1", "h2"); got["h1"] != 152 || got["h2"] != 4 {
		t.Fatalf("allocated: %v; want h1 152, h2 4", got)
	}
}
