package coordinator_test

import (
	"context"
	"sync/atomic"
	"testing"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/stockctl/stockctl/coordinator"
	"github.com/stockctl/stockctl/internal/etcdtest"
	"github.com/stockctl/stockctl/internal/keys"
)

// elseReadCut fails the first read of a refused commit's Else reads once
// armed (a read-only transaction of ranges at a past revision: what the
// committer sends after a compare refused its commit), and counts the
// order commits etcd refused.
type elseReadCut struct {
	orders  string // key prefix of order records
	armed   atomic.Bool
	cut     atomic.Int64
	refused atomic.Int64
}

func (c *elseReadCut) intercept(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	txn, ok := req.(*pb.TxnRequest)
	if !ok || info.FullMethod != "/etcdserverpb.KV/Txn" {
		return handler(ctx, req)
	}
	if c.elseRead(txn) && c.armed.CompareAndSwap(true, false) {
		c.cut.Add(1)
		return nil, status.Error(codes.Unavailable, "injected: the refused commit's reads failed")
	}
	resp, err := handler(ctx, req)
	if r, ok := resp.(*pb.TxnResponse); ok && err == nil && (writesPrefix(txn, c.orders) && !r.Succeeded || nestedRefused(r)) {
		c.refused.Add(1)
	}
	return resp, err
}

// elseRead reports whether txn only reads, each range at a revision.
func (c *elseReadCut) elseRead(txn *pb.TxnRequest) bool {
	if len(txn.Compare) > 0 || len(txn.Success) == 0 {
		return false
	}
	for _, op := range txn.Success {
		if r := op.GetRequestRange(); r == nil || r.Revision == 0 {
			return false
		}
	}
	return true
}

// nestedRefused reports whether a nested transaction of r was refused.
func nestedRefused(r *pb.TxnResponse) bool {
	for _, op := range r.Responses {
		if n := op.GetResponseTxn(); n != nil && !n.Succeeded {
			return true
		}
	}
	return false
}

// A commit refused by a compare is diagnosed by reading its Else reads
// afterwards, at its revision (segments.Engine.sendGroups). When that read
// fails, nothing was written: the orders are sent again on fresh reads of
// their places, and each is served once. A direct order (no lock) and a
// held one (a business step, under the segment's lock) each find their
// segment's counter rewritten behind the process's back (same units, a new
// revision), so that their commit is refused, and the read after it fails.
func TestRefusedCommitWhoseReadFails(t *testing.T) {
	for _, held := range []bool{false, true} {
		name := "direct"
		if held {
			name = "held"
		}
		t.Run(name, func(t *testing.T) {
			cut := &elseReadCut{orders: coordinator.DefaultPrefix + "orders/"}
			etcd := etcdtest.NewSingle(t, etcdtest.WithNoFsync(), etcdtest.WithGRPCServerOptions(grpc.ChainUnaryInterceptor(cut.intercept)))
			c := newCoordinators(t, etcd, 1)[0]
			raw := etcd.Client(t)
			ctx := t.Context()
			const sku = "tee"
			mustCreate(t, c, sku, coordinator.SKUConfig{Total: 10, Segments: 1, InitialFill: 10})
			order := func(id string) *coordinator.Allocation {
				t.Helper()
				var a *coordinator.Allocation
				var err error
				if held {
					a, err = c.AllocateFunc(ctx, sku, id, 1, "", func(context.Context) error { return nil })
				} else {
					a, err = c.Allocate(ctx, sku, id, 1, "")
				}
				if err != nil {
					t.Fatalf("order %s: %v", id, err)
				}
				return a
			}
			order("o1") // the process now knows the segment's counter

			ks, err := keys.New(coordinator.DefaultPrefix)
			if err != nil {
				t.Fatal(err)
			}
			etcdtest.Rewrite(t, raw, ks.Segment(sku, 0))
			cut.armed.Store(true)
			a := order("o2")
			if a.Replayed {
				t.Errorf("o2 answered as a replay: %+v", a)
			}
			if n := cut.refused.Load(); n == 0 {
				t.Fatal("no order commit was refused: the counter's new revision fenced nothing")
			}
			if n := cut.cut.Load(); n != 1 {
				t.Fatalf("%d reads of a refused commit failed, want 1: the fault was not injected", n)
			}
			if again := order("o2"); !again.Replayed || again.Revision != a.Revision {
				t.Errorf("o2 again: %+v; want the replay of %+v", again, a)
			}
			if rep := mustAudit(t, c, sku); rep.Allocated != 2 {
				t.Fatalf("audit allocates %d units, want 2 (o1 and o2, once each)", rep.Allocated)
			}
		})
	}
}
