package coordinator_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"google.golang.org/grpc"

	"github.com/stockctl/stockctl/coordinator"
	"github.com/stockctl/stockctl/internal/engines"
	"github.com/stockctl/stockctl/internal/etcdtest"
)

// cancelAfterWrite is a gRPC interceptor that models a caller's ctx being
// cancelled while a write's reply is on its way: once armed, the first Txn
// that writes a key with the given prefix is sent and committed, then the
// caller's cancel runs, and the reply is dropped if that cancel reached the
// call's ctx.
type cancelAfterWrite struct {
	mu     sync.Mutex
	prefix string
	cancel context.CancelFunc
	fired  bool
}

func (c *cancelAfterWrite) arm(prefix string, cancel context.CancelFunc) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.prefix, c.cancel, c.fired = prefix, cancel, false
}

func (c *cancelAfterWrite) intercept(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	err := invoker(ctx, method, req, reply, cc, opts...)
	txn, ok := req.(*etcdserverpb.TxnRequest)
	if !ok || err != nil || !c.take(txn) {
		return err
	}
	c.cancel()
	return ctx.Err() // a cancelled call never sees its reply
}

// take reports whether txn writes under the armed prefix, at most once per arming.
func (c *cancelAfterWrite) take(txn *etcdserverpb.TxnRequest) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cancel == nil || c.fired {
		return false
	}
	for _, op := range txn.Success {
		if put := op.GetRequestPut(); put != nil && strings.HasPrefix(string(put.Key), c.prefix) {
			c.fired = true
			return true
		}
	}
	return false
}

// Invariant: a move whose caller cancels its ctx after the transaction was
// sent reports what etcd did. A committed move is returned as a success
// with its revision (the rebalancer reports it and no refill goes
// unrecorded); the books balance either way.
func TestMoveOutcomeSurvivesCancel(t *testing.T) {
	etcd := etcdtest.NewSingle(t, etcdtest.WithNoFsync())
	var hook cancelAfterWrite
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   etcd.Endpoints(),
		DialTimeout: 10 * time.Second,
		DialOptions: []grpc.DialOption{grpc.WithChainUnaryInterceptor(hook.intercept)},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	c, err := coordinator.New(cli)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if _, err := c.CreateSKU(t.Context(), "m", coordinator.SKUConfig{Total: 100, Segments: 2, InitialFill: 20}); err != nil {
		t.Fatal(err)
	}

	for _, tc := range []struct {
		name     string
		prefix   string // the key the move's commit writes
		move     func(ctx context.Context) (int64, int64, error)
		poolGain int64
	}{
		{"refill", engines.Of(c).Keys.Inbox("m", 0), func(ctx context.Context) (int64, int64, error) {
			moved, rev, err := engines.Of(c).Stock.Refill(ctx, "m", map[int]int64{0: 7})
			return moved[0], rev, err
		}, -7},
		{"drain", engines.Of(c).Keys.Pool("m"), func(ctx context.Context) (int64, int64, error) {
			return engines.Of(c).Stock.Drain(ctx, "m", 1, time.Second)
		}, 10},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := auditOK(t, c)
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			hook.arm(tc.prefix, cancel)
			moved, rev, err := tc.move(ctx)
			if err != nil {
				t.Fatalf("the move committed but returned %v", err)
			}
			if ctx.Err() == nil {
				t.Fatal("the interceptor never cancelled the move's ctx: the test proves nothing")
			}
			after := auditOK(t, c)
			if got := after.Pool - before.Pool; got != tc.poolGain || rev == 0 || moved != abs(tc.poolGain) {
				t.Fatalf("returned %d moved at revision %d; the pool changed by %d, want %d", moved, rev, got, tc.poolGain)
			}
		})
	}

	// A ctx cancelled before the move is sent moves nothing.
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	before := auditOK(t, c)
	if _, _, err := engines.Of(c).Stock.Refill(ctx, "m", map[int]int64{0: 1}); !errors.Is(err, context.Canceled) {
		t.Fatalf("refill on a cancelled ctx: %v", err)
	}
	if after := auditOK(t, c); after.Pool != before.Pool {
		t.Fatalf("a cancelled refill moved stock: pool %d -> %d", before.Pool, after.Pool)
	}
}

func auditOK(t *testing.T, c *coordinator.Coordinator) *coordinator.AuditReport {
	t.Helper()
	rep, err := c.Audit(context.Background(), "m")
	if err != nil {
		t.Fatal(err)
	}
	if !rep.OK {
		t.Fatalf("audit %+v", rep)
	}
	return rep
}

func abs(n int64) int64 {
	if n < 0 {
		return -n
	}
	return n
}

// Invariant: a refill of more segments than one transaction can carry
// (etcd's --max-txn-ops) moves into every one of them; RefillBelow skips
// the segments at or over the threshold.
func TestRefillManySegments(t *testing.T) {
	etcd := etcdtest.NewSingle(t, etcdtest.WithNoFsync())
	c := newCoordinators(t, etcd, 1)[0]
	ctx := t.Context()
	const segs = 300
	mustCreate(t, c, "many", coordinator.SKUConfig{Total: 10 * segs, Segments: segs, InitialFill: segs})
	want := map[int]int64{}
	for i := range segs {
		want[i] = 2
	}
	moved, _, err := engines.Of(c).Stock.Refill(ctx, "many", want)
	if err != nil {
		t.Fatal(err)
	}
	if len(moved) != segs {
		t.Fatalf("refilled %d of %d segments", len(moved), segs)
	}
	// Every segment now holds 3; below 3 none needs a refill, below 4 all.
	if moved, _, err := engines.Of(c).Stock.RefillBelow(ctx, "many", want, 3, -1); err != nil || len(moved) != 0 {
		t.Fatalf("RefillBelow(3): %v %v, want nothing moved", moved, err)
	}
	if moved, _, err := engines.Of(c).Stock.RefillBelow(ctx, "many", want, 4, -1); err != nil || len(moved) != segs {
		t.Fatalf("RefillBelow(4): %d moved, %v; want all %d", len(moved), err, segs)
	}
	st := mustStatus(t, c, "many")
	if st.Pool != 10*segs-5*segs {
		t.Fatalf("pool %d after moving 4 into each of %d segments of 1", st.Pool, segs)
	}
	mustAudit(t, c, "many")
}

// RefillBelow with a wait gives up with ErrLocked when another process
// holds the SKU's pool lock past it, and moves nothing; once the lock is
// free it moves.
func TestRefillBelowGivesUpOnABusyPool(t *testing.T) {
	etcd := etcdtest.NewSingle(t, etcdtest.WithNoFsync())
	c := newCoordinators(t, etcd, 1)[0]
	ctx := t.Context()
	mustCreate(t, c, "busy", coordinator.SKUConfig{Total: 100, Segments: 2, InitialFill: 2})
	sess, err := concurrency.NewSession(etcd.Client(t), concurrency.WithTTL(60))
	if err != nil {
		t.Fatal(err)
	}
	defer sess.Close()
	m := concurrency.NewMutex(sess, strings.TrimSuffix(engines.Of(c).Keys.PoolLock("busy"), "/"))
	if err := m.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	want := map[int]int64{0: 5, 1: 5}
	moved, _, err := engines.Of(c).Stock.RefillBelow(ctx, "busy", want, 3, 50*time.Millisecond)
	if !errors.Is(err, coordinator.ErrLocked) || len(moved) != 0 {
		t.Fatalf("RefillBelow on a held pool: moved %v, %v; want nothing and ErrLocked", moved, err)
	}
	if st := mustStatus(t, c, "busy"); st.Pool != 98 {
		t.Fatalf("pool %d after a refill that gave up, want 98", st.Pool)
	}
	if err := m.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	moved, _, err = engines.Of(c).Stock.RefillBelow(ctx, "busy", want, 3, 50*time.Millisecond)
	if err != nil || moved[0] != 5 || moved[1] != 5 {
		t.Fatalf("RefillBelow on a free pool: moved %v, %v; want 5 into each segment", moved, err)
	}
	mustAudit(t, c, "busy")
}
