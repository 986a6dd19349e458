package coordinator_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/stockctl/stockctl/coordinator"
	"github.com/stockctl/stockctl/internal/engines"
	"github.com/stockctl/stockctl/internal/etcdtest"
)

// Invariant (issue 19, item 2): a restock is idempotent by its delivery ID.
// A retry returns the first result (replayed, the total and pool right
// after the first application) and adds nothing; the ID with another qty
// or another SKU is ErrConflict and changes nothing; Audit counts the
// deliveries.
func TestRestockIdempotentByDelivery(t *testing.T) {
	etcd := etcdtest.NewSingle(t, etcdtest.WithNoFsync())
	c := newCoordinators(t, etcd, 1)[0]
	raw := etcd.Client(t)
	ctx := t.Context()
	mustCreate(t, c, "tv", coordinator.SKUConfig{Total: 10, Segments: 2, InitialFill: 10})
	mustCreate(t, c, "radio", coordinator.SKUConfig{Total: 10, Segments: 2, InitialFill: 10})

	first, err := c.Restock(ctx, "tv", "dn-1", 8)
	if err != nil || first.Replayed || first.Total != 18 || first.Pool != 8 || first.Delivery != "dn-1" || first.Qty != 8 {
		t.Fatalf("restock: %+v, %v", first, err)
	}
	if _, err := c.Restock(ctx, "tv", "dn-2", 5); err != nil {
		t.Fatal(err)
	}
	again, err := c.Restock(ctx, "tv", "dn-1", 8)
	if err != nil || !again.Replayed || again.Total != 18 || again.Pool != 8 || again.Revision != first.Revision {
		t.Fatalf("a retry of dn-1: %+v, %v; want the first result (total 18, pool 8, revision %d), replayed", again, err, first.Revision)
	}
	before := stateDigest(t, raw, c)
	for _, tc := range []struct {
		name, sku, delivery string
		qty                 int64
		want                error
		says                string
	}{
		{"another qty", "tv", "dn-1", 9, coordinator.ErrConflict, "qty 8"},
		{"another sku", "radio", "dn-1", 8, coordinator.ErrConflict, `SKU "tv"`},
		{"no delivery", "tv", "", 8, coordinator.ErrInvalidArgument, "delivery"},
		{"bad delivery", "tv", "a b", 8, coordinator.ErrInvalidArgument, "delivery"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := c.Restock(ctx, tc.sku, tc.delivery, tc.qty)
			if !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.says) {
				t.Fatalf("got %v, want %v saying %q", err, tc.want, tc.says)
			}
		})
	}
	if after := stateDigest(t, raw, c); after != before {
		t.Fatalf("refused restocks changed the stored state:\nbefore %s\nafter  %s", before, after)
	}
	rep := mustAudit(t, c, "tv")
	if rep.Total != 23 || rep.Deliveries != 2 || rep.Delivered != 13 {
		t.Fatalf("audit: total %d, %d deliveries of %d units; want 23, 2, 13", rep.Total, rep.Deliveries, rep.Delivered)
	}
	if rep := mustAudit(t, c, "radio"); rep.Total != 10 || rep.Deliveries != 0 {
		t.Fatalf("audit of radio: %+v", rep)
	}
}

// replyLost is a server interceptor that, once armed, lets the first Txn
// writing under prefix commit and then answers it with an error: the
// restock was applied and its caller does not know it (a timeout, a cut
// connection).
type replyLost struct {
	prefix string
	armed  atomic.Bool
	fired  atomic.Int64
}

func (r *replyLost) intercept(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	txn, ok := req.(*pb.TxnRequest)
	if !ok || !writesPrefix(txn, r.prefix) || !r.armed.CompareAndSwap(true, false) {
		return handler(ctx, req)
	}
	resp, err := handler(ctx, req)
	if err != nil {
		return resp, err
	}
	r.fired.Add(1)
	return nil, status.Error(codes.Unavailable, "injected: restock reply lost")
}

// Invariant (issue 19, item 2): a restock applied whose reply was lost
// says that it may still have landed, and a retry with the same delivery
// ID tells that it did, without adding the delivery twice.
func TestRestockRetryAfterLostReply(t *testing.T) {
	lost := &replyLost{prefix: "/stockctl/deliveryid/"}
	etcd := etcdtest.NewSingle(t, etcdtest.WithNoFsync(), etcdtest.WithGRPCServerOptions(grpc.ChainUnaryInterceptor(lost.intercept)))
	c := newCoordinators(t, etcd, 1)[0]
	ctx := t.Context()
	mustCreate(t, c, "tv", coordinator.SKUConfig{Total: 10, Segments: 2, InitialFill: 10})
	if !strings.HasPrefix(engines.Of(c).Keys.DeliveryID("x"), lost.prefix) {
		t.Fatalf("the interceptor watches %q, not where delivery IDs are", lost.prefix)
	}

	lost.armed.Store(true)
	_, err := c.Restock(ctx, "tv", "dn-7", 500)
	if lost.fired.Load() != 1 {
		t.Fatal("the restock's reply was never lost: the test proves nothing")
	}
	if err == nil || !strings.Contains(err.Error(), "retry with the same delivery ID") {
		t.Fatalf("a restock whose reply was lost: %v; want an error saying to retry with the same delivery ID", err)
	}
	if rep := mustAudit(t, c, "tv"); rep.Total != 510 {
		t.Fatalf("total %d after the lost reply, want 510 (the restock was applied)", rep.Total)
	}
	r, err := c.Restock(ctx, "tv", "dn-7", 500)
	if err != nil || !r.Replayed || r.Total != 510 {
		t.Fatalf("the retry: %+v, %v; want replayed at total 510", r, err)
	}
	if rep := mustAudit(t, c, "tv"); rep.Total != 510 || rep.Pool != 500 || rep.Deliveries != 1 {
		t.Fatalf("after the retry: total %d, pool %d, %d deliveries; want 510, 500, 1", rep.Total, rep.Pool, rep.Deliveries)
	}
}

// Invariant (issue 19, item 2), under concurrency: 16 goroutines on 4
// coordinators send the same delivery at once (an operator's retries, a
// redelivered queue message) while others send distinct ones: each
// delivery is added exactly once, every duplicate is a replay of it, and
// the books balance.
func TestConcurrentRestocksOfOneDelivery(t *testing.T) {
	etcd := etcdtest.NewSingle(t, etcdtest.WithNoFsync())
	cs := newCoordinators(t, etcd, 4)
	ctx := t.Context()
	mustCreate(t, cs[0], "tv", coordinator.SKUConfig{Total: 100, Segments: 4, InitialFill: 40})
	const dup, distinct = 16, 8
	var applied, replayed atomic.Int64
	var revs sync.Map
	var wg sync.WaitGroup
	for i := range dup + distinct {
		c := cs[i%len(cs)]
		delivery := "same"
		if i >= dup {
			delivery = fmt.Sprintf("other-%d", i)
		}
		wg.Go(func() {
			r, err := c.Restock(ctx, "tv", delivery, 10)
			if err != nil {
				t.Errorf("restock %s: %v", delivery, err)
				return
			}
			if r.Replayed {
				replayed.Add(1)
			} else {
				applied.Add(1)
			}
			if prev, ok := revs.LoadOrStore(delivery, r.Revision); ok && prev != r.Revision {
				t.Errorf("delivery %s reported at revisions %d and %d", delivery, prev, r.Revision)
			}
		})
	}
	wg.Wait()
	if applied.Load() != 1+distinct || replayed.Load() != dup-1 {
		t.Fatalf("%d restocks applied, %d replayed; want %d and %d", applied.Load(), replayed.Load(), 1+distinct, dup-1)
	}
	rep := mustAudit(t, cs[0], "tv")
	if want := int64(100 + 10*(1+distinct)); rep.Total != want || rep.Deliveries != 1+distinct {
		t.Fatalf("total %d with %d deliveries, want %d with %d", rep.Total, rep.Deliveries, want, 1+distinct)
	}
}
