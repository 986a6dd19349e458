package coordinator_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/stockctl/stockctl/coordinator"
	"github.com/stockctl/stockctl/internal/engines"
	"github.com/stockctl/stockctl/internal/etcdtest"
	"github.com/stockctl/stockctl/segments"
)

// interruptFill is a server interceptor that refuses (does not apply) the
// nth transaction writing a segment counter under prefix, once armed: a
// creation interrupted half way through its fill.
type interruptFill struct {
	prefix string
	n      int64
	seen   atomic.Int64
	armed  atomic.Bool
}

func (f *interruptFill) intercept(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if txn, ok := req.(*pb.TxnRequest); ok && f.armed.Load() && writesPrefix(txn, f.prefix) && f.seen.Add(1) == f.n {
		f.armed.Store(false)
		return nil, status.Error(codes.Unavailable, "injected: creation interrupted")
	}
	return handler(ctx, req)
}

// Invariant (issue 19, item 5): an interrupted creation is resumed only
// with the config it was started with. Resuming it with another initial
// fill (or total) is ErrConflict naming the creation in progress, and
// changes nothing; resuming it with the same config completes it, and the
// result reports the fill etcd holds.
func TestCreateResumesOnlyWithItsConfig(t *testing.T) {
	cut := &interruptFill{prefix: "/stockctl/stock/big/seg/", n: 2}
	etcd := etcdtest.NewSingle(t, etcdtest.WithNoFsync(), etcdtest.WithGRPCServerOptions(grpc.ChainUnaryInterceptor(cut.intercept)))
	// 8 segment counters per fill transaction: 20 segments take three.
	c := newCoordinators(t, etcd, 1, coordinator.WithMaxTxnOps(10))[0]
	raw := etcd.Client(t)
	ctx := t.Context()
	cfg := coordinator.SKUConfig{Total: 1000, Segments: 20, InitialFill: 630, LowWatermark: 5, RefillBatch: 10}

	cut.armed.Store(true)
	if _, err := c.CreateSKU(ctx, "big", cfg); err == nil {
		t.Fatal("the interrupted creation succeeded: the fault was not injected")
	}
	if _, err := c.Status(ctx, "big"); !errors.Is(err, coordinator.ErrUnknownSKU) {
		t.Fatalf("status of a creation in progress: %v, want ErrUnknownSKU", err)
	}
	before := stateDigest(t, raw, c)
	for _, tc := range []struct {
		name string
		cfg  coordinator.SKUConfig
	}{
		{"another fill", coordinator.SKUConfig{Total: 1000, Segments: 20, InitialFill: 5, LowWatermark: 5, RefillBatch: 10}},
		{"another total", coordinator.SKUConfig{Total: 999, Segments: 20, InitialFill: 630, LowWatermark: 5, RefillBatch: 10}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := c.CreateSKU(ctx, "big", tc.cfg)
			if !errors.Is(err, coordinator.ErrConflict) || !strings.Contains(err.Error(), "initial fill 630") || !strings.Contains(err.Error(), "total 1000") {
				t.Fatalf("resuming with %+v: %v; want ErrConflict naming the creation in progress", tc.cfg, err)
			}
			if after := stateDigest(t, raw, c); after != before {
				t.Fatalf("a refused resumption changed the stored state:\nbefore %s\nafter  %s", before, after)
			}
		})
	}

	meta, err := c.CreateSKU(ctx, "big", cfg)
	if err != nil || meta.InitialFill != 630 || meta.Total != 1000 || meta.Creating {
		t.Fatalf("resuming with the same config: %+v, %v", meta, err)
	}
	st := mustStatus(t, c, "big")
	var inSegments int64
	for _, s := range st.Segments {
		inSegments += s.Remaining
	}
	if inSegments != meta.InitialFill || st.Pool != meta.Total-meta.InitialFill {
		t.Fatalf("reported fill %d, but etcd holds %d in the segments and %d in the pool", meta.InitialFill, inSegments, st.Pool)
	}
	mustAudit(t, c, "big")
	// A completed SKU's record no longer carries the fill; creating it
	// again, with any config, is a plain conflict.
	resp, err := raw.Get(ctx, engines.Of(c).Keys.Meta("big"))
	if err != nil {
		t.Fatal(err)
	}
	if m, err := segments.DecodeMeta("meta", resp.Kvs[0].Value); err != nil || m.Creating || m.InitialFill != 0 {
		t.Fatalf("the completed meta record: %+v, %v", m, err)
	}
	if _, err := c.CreateSKU(ctx, "big", cfg); !errors.Is(err, coordinator.ErrConflict) || !strings.Contains(err.Error(), "already exists") {
		t.Fatalf("creating a created SKU: %v", err)
	}
}

// Invariant (issue 19, item 5), under concurrency: 12 resumptions of one
// interrupted creation on 3 coordinators, a third of them with another
// fill. Those never apply their fill; the others complete the creation
// once (at least one succeeds; any other is a conflict), and etcd ends
// holding exactly the fill the creation was started with.
func TestConcurrentResumesOfACreation(t *testing.T) {
	cut := &interruptFill{prefix: "/stockctl/stock/big/seg/", n: 2}
	etcd := etcdtest.NewSingle(t, etcdtest.WithNoFsync(), etcdtest.WithGRPCServerOptions(grpc.ChainUnaryInterceptor(cut.intercept)))
	cs := newCoordinators(t, etcd, 3, coordinator.WithMaxTxnOps(10))
	ctx := t.Context()
	cfg := coordinator.SKUConfig{Total: 1000, Segments: 20, InitialFill: 630}
	cut.armed.Store(true)
	if _, err := cs[0].CreateSKU(ctx, "big", cfg); err == nil {
		t.Fatal("the interrupted creation succeeded: the fault was not injected")
	}
	var ok atomic.Int64
	errs := make(chan error, 12)
	for i := range 12 {
		c := cs[i%len(cs)]
		go func() {
			mine := cfg
			if i%3 == 0 {
				mine.InitialFill = 5
			}
			meta, err := c.CreateSKU(ctx, "big", mine)
			switch {
			case err == nil && mine.InitialFill == 630 && meta.InitialFill == 630:
				ok.Add(1)
				errs <- nil
			case errors.Is(err, coordinator.ErrConflict):
				errs <- nil
			default:
				errs <- fmt.Errorf("resumption with fill %d: %+v, %w", mine.InitialFill, meta, err)
			}
		}()
	}
	for range 12 {
		if err := <-errs; err != nil {
			t.Errorf("%v", err)
		}
	}
	if ok.Load() == 0 {
		t.Fatal("no resumption with the creation's config completed it")
	}
	st := mustStatus(t, cs[0], "big")
	if st.Pool != 370 {
		t.Fatalf("pool %d after the creation, want 370: the segments hold another fill than 630", st.Pool)
	}
	mustAudit(t, cs[0], "big")
}

// fillBetween is a server interceptor for the race that made units in
// TestConcurrentResumesOfACreation on a busy machine: once armed, the
// first read of the pool key (a resumption's fill, after its snapshot)
// waits until another resumption (run by the test's raw client) has
// filled every segment and written the pool, then reads.
type fillBetween struct {
	pool  string
	armed atomic.Bool
	fill  func() error // the other resumption's fill
	err   error
}

func (f *fillBetween) intercept(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if r, ok := req.(*pb.RangeRequest); ok && string(r.Key) == f.pool && len(r.RangeEnd) == 0 && f.armed.CompareAndSwap(true, false) {
		f.err = f.fill()
	}
	return handler(ctx, req)
}

// Invariant: a resumption of an interrupted creation never makes units,
// whatever another resumption commits between its snapshot and its
// transaction. Deterministically: the creation is cut after its first
// fill transaction (8 of 20 segments filled); a resumption takes its
// snapshot, and before it reads the pool another resumption fills the
// other 12 segments and writes the pool. The first resumption's fill,
// worked out from its snapshot, must then be refused, not write the pool
// from the snapshot's value (which put 12 segments' fill back in the pool:
// it fails if the pool is read at the latest revision).
func TestResumptionFillsBetweenSnapshotAndPoolRead(t *testing.T) {
	cut := &interruptFill{prefix: "/stockctl/stock/big/seg/", n: 2}
	between := &fillBetween{pool: "/stockctl/stock/big/pool"}
	etcd := etcdtest.NewSingle(t, etcdtest.WithNoFsync(),
		etcdtest.WithGRPCServerOptions(grpc.ChainUnaryInterceptor(cut.intercept, between.intercept)))
	c := newCoordinators(t, etcd, 1, coordinator.WithMaxTxnOps(10))[0]
	raw := etcd.Client(t)
	ctx := t.Context()
	cfg := coordinator.SKUConfig{Total: 1000, Segments: 20, InitialFill: 620}
	k := engines.Of(c).Keys

	cut.armed.Store(true)
	if _, err := c.CreateSKU(ctx, "big", cfg); err == nil {
		t.Fatal("the interrupted creation succeeded: the fault was not injected")
	}
	// The other resumption: every segment at its target (31), the pool
	// at what is left, in one transaction, as a resumption with room for
	// all 20 would write it.
	between.fill = func() error {
		var ops []clientv3.Op
		for i := range cfg.Segments {
			ops = append(ops, clientv3.OpPut(k.Segment("big", i), segments.EncodeCounter(31)))
		}
		ops = append(ops, clientv3.OpPut(k.Pool("big"), segments.EncodeCounter(cfg.Total-cfg.InitialFill)))
		_, err := raw.Txn(ctx).Then(ops...).Commit()
		return err
	}
	between.armed.Store(true)
	meta, err := c.CreateSKU(ctx, "big", cfg)
	if between.armed.Load() {
		t.Fatal("the resumption read no pool: the race was not staged")
	}
	if between.err != nil {
		t.Fatalf("the other resumption's fill: %v", between.err)
	}
	if err != nil && !errors.Is(err, coordinator.ErrConflict) {
		t.Fatalf("the resumption: %+v, %v", meta, err)
	}
	if err != nil { // a conflict: finish the creation as a caller would
		if _, err := c.CreateSKU(ctx, "big", cfg); err != nil {
			t.Fatalf("resuming again: %v", err)
		}
	}
	st := mustStatus(t, c, "big")
	var inSegments int64
	for _, s := range st.Segments {
		inSegments += s.Remaining
	}
	if st.Pool != 380 || inSegments != 620 {
		t.Fatalf("after the creation: pool %d and segments %d, want 380 and 620 (%d units made)", st.Pool, inSegments, st.Pool+inSegments-1000)
	}
	mustAudit(t, c, "big")
}
