package coordinator_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/stockctl/stockctl/coordinator"
	"github.com/stockctl/stockctl/internal/etcdtest"
	"github.com/stockctl/stockctl/rebalance"
)

// testCluster is one embedded etcd of a fleet test, with a proxy in front
// of it (to cut it off) and a raw client that bypasses the proxy.
type testCluster struct {
	name  string
	etcd  *etcdtest.Single
	proxy *etcdtest.Proxy
	raw   *clientv3.Client
}

func newTestClusters(t *testing.T, names ...string) []*testCluster {
	t.Helper()
	out := make([]*testCluster, len(names))
	for i, n := range names {
		e := etcdtest.NewSingle(t, etcdtest.WithNoFsync())
		out[i] = &testCluster{name: n, etcd: e, proxy: etcdtest.NewProxy(t, e.Endpoints()[0]), raw: e.Client(t)}
	}
	return out
}

// newFleet returns a coordinator over tcs, each reached through its proxy.
func newFleet(t *testing.T, ctx context.Context, tcs []*testCluster, opts ...coordinator.Option) (*coordinator.Coordinator, error) {
	t.Helper()
	cls := make([]coordinator.Cluster, len(tcs))
	for i, tc := range tcs {
		cls[i] = coordinator.Cluster{Name: tc.name, Client: etcdtest.NewClient(t, tc.proxy.Endpoint())}
	}
	c, err := coordinator.NewClusters(ctx, cls, opts...)
	if err == nil {
		t.Cleanup(func() { c.Close() })
	}
	return c, err
}

func mustFleet(t *testing.T, tcs []*testCluster, opts ...coordinator.Option) *coordinator.Coordinator {
	t.Helper()
	c, err := newFleet(t, t.Context(), tcs, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// metaIn reports which of tcs hold sku's meta record, read directly.
func metaIn(t *testing.T, tcs []*testCluster, sku string) []string {
	t.Helper()
	var in []string
	for _, tc := range tcs {
		resp, err := tc.raw.Get(t.Context(), coordinator.DefaultPrefix+"meta/"+sku)
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.Kvs) > 0 {
			in = append(in, tc.name)
		}
	}
	return in
}

// SKUs created through a fleet land wholly in one cluster each, spread by
// their names; a second process finds every one (its first read of a SKU
// reads every cluster), sells and restocks it there, and the books
// balance per SKU; explicit placement is kept; listing covers both.
func TestClustersPlacement(t *testing.T) {
	tcs := newTestClusters(t, "a", "b")
	c1, c2 := mustFleet(t, tcs), mustFleet(t, tcs)
	ctx := t.Context()
	var names []string
	for i := range 12 {
		sku := fmt.Sprintf("p%d", i)
		names = append(names, sku)
		mustCreate(t, c1, sku, coordinator.SKUConfig{Total: 100, Segments: 2, InitialFill: 20})
	}
	if _, err := c1.CreateSKUIn(ctx, "b", "pinned", coordinator.SKUConfig{Total: 10, Segments: 1, InitialFill: 10}); err != nil {
		t.Fatal(err)
	}
	names = append(names, "pinned")
	per := map[string]int{}
	for _, sku := range names {
		in := metaIn(t, tcs, sku)
		if len(in) != 1 {
			t.Fatalf("%s: meta in %v, want exactly one cluster", sku, in)
		}
		per[in[0]]++
		where, err := c2.ClusterOf(ctx, sku)
		if err != nil || where != in[0] {
			t.Fatalf("%s: second process finds it in %q (%v), etcd has it in %s", sku, where, err, in[0])
		}
		if _, err := c2.Allocate(ctx, sku, "o1", 3, "u"); err != nil {
			t.Fatalf("%s: allocate: %v", sku, err)
		}
		if _, err := c2.Restock(ctx, sku, "d-"+sku, 5); err != nil {
			t.Fatalf("%s: restock: %v", sku, err)
		}
		if _, err := c1.Release(ctx, sku, "o1"); err != nil {
			t.Fatalf("%s: release: %v", sku, err)
		}
		mustAudit(t, c1, sku)
		// Its segment keys are in its cluster only.
		for _, tc := range tcs {
			resp, err := tc.raw.Get(ctx, coordinator.DefaultPrefix+"stock/"+sku+"/", clientv3.WithPrefix(), clientv3.WithCountOnly())
			if err != nil {
				t.Fatal(err)
			}
			if (resp.Count > 0) != (tc.name == in[0]) {
				t.Fatalf("%s: %d stock keys in cluster %s, its meta in %s", sku, resp.Count, tc.name, in[0])
			}
		}
	}
	if metaIn(t, tcs, "pinned")[0] != "b" {
		t.Fatal("pinned is not in b")
	}
	if per["a"] == 0 || per["b"] == 0 {
		t.Fatalf("placement %v: every SKU in one cluster", per)
	}
	all, err := c2.SKUs(ctx)
	if err != nil || len(all) != len(names) {
		t.Fatalf("SKUs: %v (%v), want %d", all, err, len(names))
	}
	if _, err := c2.CreateSKUIn(ctx, "a", "pinned", coordinator.SKUConfig{Total: 10, Segments: 1, InitialFill: 10}); !errors.Is(err, coordinator.ErrConflict) || !strings.Contains(err.Error(), `"b"`) {
		t.Fatalf("creating pinned in a: %v, want a conflict naming b", err)
	}
}

// One cluster cut off (its proxy blackholed, then its etcd stopped): its
// SKUs and locks fail with an error naming it that matches
// ErrClusterUnavailable; the other cluster's SKUs sell on and balance, its
// locks are taken; a process started while the cluster is cut off serves
// the other; once the cluster is back, its SKUs sell again.
func TestClustersOneDown(t *testing.T) {
	tcs := newTestClusters(t, "a", "b")
	c := mustFleet(t, tcs)
	ctx := t.Context()
	cfg := coordinator.SKUConfig{Total: 1000, Segments: 4, InitialFill: 400}
	for _, cl := range []string{"a", "b"} {
		if _, err := c.CreateSKUIn(ctx, cl, "on-"+cl, cfg); err != nil {
			t.Fatal(err)
		}
	}
	lockIn := map[string]string{} // a lock name placed in each cluster
	for i := 0; len(lockIn) < 2; i++ {
		name := fmt.Sprintf("l%d", i)
		l, err := c.Lock(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		ls, _, err := c.Locks(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range ls {
			if s.Name == name && lockIn[s.Cluster] == "" {
				lockIn[s.Cluster] = name
			}
		}
		if err := l.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	}

	for _, fault := range []string{"blackhole", "stop"} {
		t.Run(fault, func(t *testing.T) {
			b := tcs[1]
			if fault == "blackhole" {
				b.proxy.Blackhole()
				defer b.proxy.Heal()
			} else {
				b.etcd.Stop()
				defer b.etcd.Restart(t)
			}
			down := func(what string, err error) {
				t.Helper()
				if !errors.Is(err, coordinator.ErrClusterUnavailable) || !strings.Contains(err.Error(), `"b"`) {
					t.Fatalf("%s on the cut-off cluster: %v, want ErrClusterUnavailable naming b", what, err)
				}
			}
			short := func() (context.Context, context.CancelFunc) { return context.WithTimeout(ctx, 2*time.Second) }
			sctx, cancel := short()
			_, err := c.Allocate(sctx, "on-b", "x-"+fault, 1, "u")
			cancel()
			down("allocate", err)
			sctx, cancel = short()
			_, err = c.Lock(sctx, lockIn["b"])
			cancel()
			down("lock", err)

			// A process started now serves cluster a.
			c2, err := newFleet(t, ctx, tcs, coordinator.WithFleetCheckWait(time.Second))
			if err != nil {
				t.Fatalf("a process starting with cluster b cut off: %v", err)
			}
			for i, cc := range []*coordinator.Coordinator{c, c2} {
				for j := range 20 {
					if _, err := cc.Allocate(ctx, "on-a", fmt.Sprintf("%s-%d-%d", fault, i, j), 2, fmt.Sprint(j)); err != nil {
						t.Fatalf("allocate on cluster a while b is cut off: %v", err)
					}
				}
			}
			l, err := c2.Lock(ctx, lockIn["a"])
			if err != nil {
				t.Fatalf("lock on cluster a while b is cut off: %v", err)
			}
			if err := l.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
			mustAudit(t, c2, "on-a")
			sctx, cancel = short()
			_, err = c2.Status(sctx, "on-b")
			cancel()
			down("status from a process started without b", err)
			sctx, cancel = short()
			_, err = c2.SKUs(sctx)
			cancel()
			down("SKUs", err)
			c2.Close()
		})
		// Back: its SKUs sell again (once the client has reconnected; the
		// retries share one order ID, so at most one deducts).
		etcdtest.WaitFor(t, "cluster b sells again", time.Minute, func() bool {
			sctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			defer cancel()
			_, err := c.Allocate(sctx, "on-b", "back-"+fault, 1, "u")
			return err == nil
		})
		mustAudit(t, c, "on-b")
	}
}

// Adding a cluster at the end moves nothing: every SKU stays where it
// was, locks are placed over the fleet's first clusters still, new SKUs
// may land in the new one, and a process started with the old list is
// refused from then on.
func TestClustersAddCluster(t *testing.T) {
	tcs := newTestClusters(t, "a", "b", "c")
	old := mustFleet(t, tcs[:2])
	ctx := t.Context()
	where := map[string]string{}
	for i := range 20 {
		sku := fmt.Sprintf("s%d", i)
		mustCreate(t, old, sku, coordinator.SKUConfig{Total: 10, Segments: 1, InitialFill: 10})
		where[sku] = metaIn(t, tcs, sku)[0]
	}
	grown := mustFleet(t, tcs)
	for sku, w := range where {
		got, err := grown.ClusterOf(ctx, sku)
		if err != nil || got != w {
			t.Fatalf("%s: in %q after adding c (%v), was in %q", sku, got, err, w)
		}
		if _, err := grown.Allocate(ctx, sku, "o", 1, ""); err != nil {
			t.Fatal(err)
		}
	}
	// Locks: every name is placed where the old list placed it.
	for i := range 30 {
		name := fmt.Sprintf("lk%d", i)
		l1, err := old.Lock(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		l2, err := grown.Lock(ctx, name, coordinator.TryFor(0))
		if !errors.Is(err, coordinator.ErrLocked) {
			t.Fatalf("lock %s held by the old process, taken by the grown one: %v (two clusters?)", name, err)
		}
		if l2 != nil {
			l2.Unlock(ctx)
		}
		l1.Unlock(ctx)
	}
	inC := 0
	for i := range 30 {
		sku := fmt.Sprintf("n%d", i)
		mustCreate(t, grown, sku, coordinator.SKUConfig{Total: 10, Segments: 1, InitialFill: 10})
		if metaIn(t, tcs, sku)[0] == "c" {
			inC++
		}
	}
	if inC == 0 {
		t.Fatal("no new SKU placed in the added cluster")
	}
	if _, err := newFleet(t, ctx, tcs[:2]); !errors.Is(err, coordinator.ErrFleetMismatch) {
		t.Fatalf("a process with the old list after the fleet grew: %v, want ErrFleetMismatch", err)
	}
}

// Processes whose cluster lists disagree are refused at start: another
// order (another registry), and the endpoints of one cluster given under
// another's name.
func TestClustersListMismatch(t *testing.T) {
	tcs := newTestClusters(t, "a", "b")
	mustFleet(t, tcs)
	ctx := t.Context()
	if _, err := newFleet(t, ctx, []*testCluster{tcs[1], tcs[0]}); !errors.Is(err, coordinator.ErrFleetMismatch) {
		t.Fatalf("clusters in another order: %v, want ErrFleetMismatch", err)
	}
	swapped := []*testCluster{{name: "a", proxy: tcs[1].proxy}, {name: "b", proxy: tcs[0].proxy}}
	_, err := newFleet(t, ctx, swapped)
	if !errors.Is(err, coordinator.ErrFleetMismatch) || !strings.Contains(err.Error(), "reach cluster") {
		t.Fatalf("endpoints swapped: %v, want ErrFleetMismatch", err)
	}
	// A cluster holding SKUs from before cannot join as a second cluster.
	extra := newTestClusters(t, "x")
	solo, err := coordinator.New(extra[0].raw)
	if err != nil {
		t.Fatal(err)
	}
	defer solo.Close()
	mustCreate(t, solo, "old", coordinator.SKUConfig{Total: 1, Segments: 1, InitialFill: 1})
	fresh := newTestClusters(t, "f")
	if _, err := newFleet(t, ctx, []*testCluster{fresh[0], extra[0]}); !errors.Is(err, coordinator.ErrFleetMismatch) {
		t.Fatalf("a second cluster holding a SKU: %v, want ErrFleetMismatch", err)
	}
}

// Concurrent creations of one name by processes that place it in
// different clusters never make two SKUs: exactly one succeeds, and the
// name's meta record is in one cluster. Deletes racing creations of the
// same name in the other cluster never leave it in both either.
func TestClustersConcurrentCreate(t *testing.T) {
	tcs := newTestClusters(t, "a", "b")
	p := []*coordinator.Coordinator{mustFleet(t, tcs), mustFleet(t, tcs)}
	ctx := t.Context()
	cfg := coordinator.SKUConfig{Total: 10, Segments: 1, InitialFill: 10}
	for round := range 20 {
		sku := fmt.Sprintf("race%d", round)
		var wg sync.WaitGroup
		errs := make([]error, 2)
		for i, cl := range []string{"a", "b"} {
			wg.Go(func() { _, errs[i] = p[i].CreateSKUIn(ctx, cl, sku, cfg) })
		}
		wg.Wait()
		ok := 0
		for _, err := range errs {
			switch {
			case err == nil:
				ok++
			case !errors.Is(err, coordinator.ErrConflict):
				t.Fatalf("%s: %v", sku, err)
			}
		}
		if in := metaIn(t, tcs, sku); ok != 1 || len(in) != 1 {
			t.Fatalf("%s: %d creations succeeded, meta in %v", sku, ok, in)
		}
	}
	// Delete and create again elsewhere, racing.
	for round := range 20 {
		sku := fmt.Sprintf("race%d", round)
		from := metaIn(t, tcs, sku)[0]
		to := map[string]string{"a": "b", "b": "a"}[from]
		var wg sync.WaitGroup
		var createErr, deleteErr error
		wg.Go(func() { _, deleteErr = p[0].DeleteSKU(ctx, sku) })
		wg.Go(func() {
			for range 3 { // a conflict while the delete runs is retried
				if _, createErr = p[1].CreateSKUIn(ctx, to, sku, cfg); !errors.Is(createErr, coordinator.ErrConflict) {
					return
				}
			}
		})
		wg.Wait()
		if deleteErr != nil && !errors.Is(deleteErr, coordinator.ErrConflict) {
			t.Fatalf("%s: delete: %v", sku, deleteErr)
		}
		if createErr != nil && !errors.Is(createErr, coordinator.ErrConflict) {
			t.Fatalf("%s: create in %s: %v", sku, to, createErr)
		}
		if in := metaIn(t, tcs, sku); len(in) > 1 {
			t.Fatalf("%s: meta in %v after a delete raced a creation in %s", sku, in, to)
		}
	}
}

// The rebalancer is elected per cluster: one on each cluster's member
// refills that cluster's SKUs (its election key and last pass in that
// cluster), and knows nothing of the other's; New refuses the fleet's
// coordinator itself.
func TestClustersRebalancerPerCluster(t *testing.T) {
	tcs := newTestClusters(t, "a", "b")
	c := mustFleet(t, tcs)
	ctx := t.Context()
	if _, err := rebalance.New(c, rebalance.Config{}); !errors.Is(err, coordinator.ErrInvalidArgument) {
		t.Fatalf("rebalance.New on the fleet: %v, want ErrInvalidArgument", err)
	}
	for _, cl := range c.Clusters() {
		sku := "r-" + cl
		if _, err := c.CreateSKUIn(ctx, cl, sku, coordinator.SKUConfig{Total: 100, Segments: 2, InitialFill: 2, LowWatermark: 5, RefillBatch: 10}); err != nil {
			t.Fatal(err)
		}
	}
	for i, cl := range c.Clusters() {
		r, err := rebalance.New(c.Cluster(cl), rebalance.Config{Identity: "reb-" + cl})
		if err != nil {
			t.Fatal(err)
		}
		p, err := r.RunOnce(ctx, "r-"+cl)
		if err != nil || len(p.Moves) == 0 {
			t.Fatalf("cluster %s: pass %+v, %v: want refills", cl, p, err)
		}
		other := "r-" + c.Clusters()[1-i]
		if _, err := r.RunOnce(ctx, other); !errors.Is(err, coordinator.ErrUnknownSKU) {
			t.Fatalf("cluster %s's rebalancer on %s: %v, want ErrUnknownSKU", cl, other, err)
		}
		resp, err := tcs[i].raw.Get(ctx, coordinator.DefaultPrefix+"rebalance/last")
		if err != nil || len(resp.Kvs) == 0 || !strings.Contains(string(resp.Kvs[0].Value), "reb-"+cl) {
			t.Fatalf("cluster %s: last pass %v (%v), want reb-%s's", cl, resp, err, cl)
		}
		mustAudit(t, c, "r-"+cl)
	}
}

// An order of several lines whose SKUs share a cluster is one transaction
// there: sold (and released) as one order.
func TestClustersOrderOfSeveralLines(t *testing.T) {
	tcs := newTestClusters(t, "a", "b")
	c := mustFleet(t, tcs)
	ctx := t.Context()
	cfg := coordinator.SKUConfig{Total: 10, Segments: 1, InitialFill: 10}
	for _, p := range [][2]string{{"a", "a1"}, {"a", "a2"}, {"b", "b1"}} {
		if _, err := c.CreateSKUIn(ctx, p[0], p[1], cfg); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.AllocateOrder(ctx, "cart-1", []coordinator.Line{{SKU: "a1", Qty: 1}, {SKU: "a2", Qty: 2}}); err != nil {
		t.Fatalf("order of two lines in cluster a: %v", err)
	}
	if _, err := c.ReleaseOrder(ctx, "a2", "cart-1"); err != nil {
		t.Fatalf("release it: %v", err)
	}
	// Lines in two clusters: clusters_cart_test.go.
	for _, sku := range []string{"a1", "a2", "b1"} {
		if r := mustAudit(t, c, sku); r.Allocated != 0 {
			t.Fatalf("%s allocated %d after the release", sku, r.Allocated)
		}
	}
}

// A sale of many SKUs over three clusters by two processes, with
// reservations, confirms, releases and restocks; one cluster is stopped
// mid-sale. Every operation on the other clusters' SKUs succeeds; every
// failure is on the stopped cluster's SKUs and names it; every
// acknowledged order is recorded in its SKU's cluster; the books of every
// SKU balance; once the cluster is back its SKUs sell again.
func TestClustersSaleWithOneStoppedMidSale(t *testing.T) {
	tcs := newTestClusters(t, "a", "b", "c")
	procs := []*coordinator.Coordinator{mustFleet(t, tcs), mustFleet(t, tcs)}
	ctx := t.Context()
	var skus []string
	in := map[string]string{}
	for i := range 9 {
		sku := fmt.Sprintf("sale%d", i)
		mustCreate(t, procs[0], sku, coordinator.SKUConfig{Total: 10000, Segments: 4, InitialFill: 2000})
		skus = append(skus, sku)
		in[sku] = metaIn(t, tcs, sku)[0]
	}
	for _, cl := range []string{"a", "b", "c"} {
		found := false
		for _, w := range in {
			found = found || w == cl
		}
		if !found {
			t.Fatalf("no SKU placed in %s: %v", cl, in)
		}
	}
	const buyers, opsEach = 6, 60
	var (
		mu      sync.Mutex
		acked   = map[string][]string{} // sku → acknowledged order IDs
		done    int
		stopped = make(chan struct{})
	)
	var failedOnC atomic.Int64
	fail := func(sku, what string, err error) {
		failedOnC.Add(1)
		if in[sku] != "c" {
			t.Errorf("%s on %s (cluster %s) while c is down: %v", what, sku, in[sku], err)
			return
		}
		if ce, ok := errors.AsType[*coordinator.ClusterError](err); (!ok || ce.Cluster != "c") && !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("%s on %s: %v, want an error naming cluster c", what, sku, err)
		}
	}
	var wg sync.WaitGroup
	for bi := range buyers {
		c := procs[bi%2]
		wg.Go(func() {
			for j := range opsEach {
				sku := skus[(bi+j)%len(skus)]
				order := fmt.Sprintf("b%d-%d", bi, j)
				octx, cancel := context.WithTimeout(ctx, 5*time.Second)
				var err error
				switch j % 5 {
				case 0:
					_, err = c.Restock(octx, sku, "d-"+order, 3)
				case 1:
					if _, err = c.Reserve(octx, sku, order, 1, order, time.Minute); err == nil {
						_, err = c.Confirm(octx, sku, order)
					}
				case 2:
					if _, err = c.Allocate(octx, sku, order, 2, order); err == nil {
						_, err = c.Release(octx, sku, order)
					}
				default:
					_, err = c.Allocate(octx, sku, order, 1, order)
				}
				cancel()
				mu.Lock()
				if err == nil && j%5 != 0 {
					acked[sku] = append(acked[sku], order)
				}
				done++
				if done == buyers*opsEach/3 {
					tcs[2].etcd.Stop() // mid-sale
					close(stopped)
				}
				mu.Unlock()
				select {
				case <-stopped:
					if err != nil {
						fail(sku, "order "+order, err)
					}
				default:
					if err != nil {
						t.Errorf("order %s on %s before the stop: %v", order, sku, err)
					}
				}
			}
		})
	}
	wg.Wait()
	if failedOnC.Load() == 0 {
		t.Fatal("no order failed on cluster c after it was stopped: the fault was not exercised")
	}
	tcs[2].etcd.Restart(t)
	for _, sku := range skus {
		if in[sku] != "c" {
			continue
		}
		etcdtest.WaitFor(t, "cluster c sells "+sku+" again", time.Minute, func() bool {
			octx, cancel := context.WithTimeout(ctx, 2*time.Second)
			defer cancel()
			_, err := procs[1].Allocate(octx, sku, "after", 1, "")
			return err == nil
		})
	}
	for _, sku := range skus {
		// Each process's connection to c comes back on its own backoff
		// (procs[1] sold above): wait for procs[0]'s too.
		etcdtest.WaitFor(t, "process 0 reaches the cluster of "+sku, time.Minute, func() bool {
			sctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			defer cancel()
			_, err := procs[0].Status(sctx, sku)
			return err == nil
		})
		mustAudit(t, procs[0], sku)
		tc := tcs[map[string]int{"a": 0, "b": 1, "c": 2}[in[sku]]]
		for _, order := range acked[sku] {
			resp, err := tc.raw.Get(ctx, coordinator.DefaultPrefix+"orders/"+sku+"/"+order)
			if err != nil || len(resp.Kvs) != 1 {
				t.Fatalf("acknowledged order %s of %s not recorded in cluster %s (%v)", order, sku, in[sku], err)
			}
		}
	}
}

// Moving a SKU (docs/deploy.md): delete it in one cluster and create it
// again in another. A process that cached the old cluster finds the new
// one on its next order; the new SKU's books start afresh, and an old
// order ID is a new order there (as the docs warn).
func TestClustersMoveSKU(t *testing.T) {
	tcs := newTestClusters(t, "a", "b")
	admin, seller := mustFleet(t, tcs), mustFleet(t, tcs)
	ctx := t.Context()
	cfg := coordinator.SKUConfig{Total: 50, Segments: 2, InitialFill: 50}
	if _, err := admin.CreateSKUIn(ctx, "a", "mv", cfg); err != nil {
		t.Fatal(err)
	}
	if _, err := seller.Allocate(ctx, "mv", "o1", 5, "u"); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.DeleteSKU(ctx, "mv"); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.CreateSKUIn(ctx, "b", "mv", coordinator.SKUConfig{Total: 45, Segments: 1, InitialFill: 45}); err != nil {
		t.Fatalf("create again in b: %v", err)
	}
	if in := metaIn(t, tcs, "mv"); len(in) != 1 || in[0] != "b" {
		t.Fatalf("after the move: meta in %v", in)
	}
	// An order of two lines, one the moved SKU, the other a SKU of b: the
	// seller's cached placement of mv (a) is stale, not a reason to refuse.
	if _, err := admin.CreateSKUIn(ctx, "b", "mv2", cfg); err != nil {
		t.Fatal(err)
	}
	if _, err := seller.AllocateOrder(ctx, "cart", []coordinator.Line{{SKU: "mv", Qty: 1}, {SKU: "mv2", Qty: 1}}); err != nil {
		t.Fatalf("order of mv and mv2 (both in b) from a process that cached mv in a: %v", err)
	}
	a, err := seller.Allocate(ctx, "mv", "o1", 5, "u")
	if err != nil || a.Replayed {
		t.Fatalf("old order ID on the moved SKU, from a process that cached cluster a: %+v, %v (want a new order)", a, err)
	}
	if where, _ := seller.ClusterOf(ctx, "mv"); where != "b" {
		t.Fatalf("seller finds mv in %q", where)
	}
	r := mustAudit(t, seller, "mv")
	if r.Total != 45 || r.Allocated != 6 { // o1 and the cart's line
		t.Fatalf("moved SKU's books: total %d allocated %d", r.Total, r.Allocated)
	}
}

// WithMetrics over several clusters: every member's metrics are
// registered once, each with a "cluster" label naming its cluster.
func TestClustersMetricsLabel(t *testing.T) {
	tcs := newTestClusters(t, "a", "b")
	reg := prometheus.NewRegistry()
	c := mustFleet(t, tcs, coordinator.WithMetrics(reg))
	ctx := t.Context()
	for _, cl := range []string{"a", "b"} {
		if _, err := c.CreateSKUIn(ctx, cl, "m-"+cl, coordinator.SKUConfig{Total: 10, Segments: 1, InitialFill: 10}); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Allocate(ctx, "m-"+cl, "o", 1, ""); err != nil {
			t.Fatal(err)
		}
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "cluster" {
					seen[l.GetValue()] = true
				}
			}
		}
	}
	if !seen["a"] || !seen["b"] || len(seen) != 2 {
		t.Fatalf("cluster labels %v, want a and b", seen)
	}
}

// A delete interrupted after the SKU's keys went but before its placement
// was forgotten (the claim left marked forgetting): creations of the name
// are refused, saying so; DeleteSKU completes it (answering unknown SKU),
// and the name can then be created in another cluster.
func TestClustersInterruptedDelete(t *testing.T) {
	tcs := newTestClusters(t, "a", "b")
	c := mustFleet(t, tcs)
	ctx := t.Context()
	cfg := coordinator.SKUConfig{Total: 5, Segments: 1, InitialFill: 5}
	if _, err := c.CreateSKUIn(ctx, "b", "half", cfg); err != nil {
		t.Fatal(err)
	}
	// The delete's first steps, by hand: the SKU's keys gone from b and
	// its claim marked forgetting, then the process died.
	solo, err := coordinator.New(tcs[1].raw)
	if err != nil {
		t.Fatal(err)
	}
	defer solo.Close()
	if _, err := solo.DeleteSKU(ctx, "half"); err != nil {
		t.Fatal(err)
	}
	if _, err := tcs[0].raw.Put(ctx, coordinator.DefaultPrefix+"placement/half", `{"cluster":"b","forgetting":true}`); err != nil {
		t.Fatal(err)
	}
	if _, err := c.CreateSKUIn(ctx, "a", "half", cfg); !errors.Is(err, coordinator.ErrConflict) || !strings.Contains(err.Error(), "DeleteSKU completes it") {
		t.Fatalf("create while the claim is forgetting: %v", err)
	}
	if _, err := c.DeleteSKU(ctx, "half"); !errors.Is(err, coordinator.ErrUnknownSKU) {
		t.Fatalf("DeleteSKU completing the interrupted delete: %v, want ErrUnknownSKU", err)
	}
	if _, err := c.CreateSKUIn(ctx, "a", "half", cfg); err != nil {
		t.Fatalf("create in a after the delete completed: %v", err)
	}
	if in := metaIn(t, tcs, "half"); len(in) != 1 || in[0] != "a" {
		t.Fatalf("half in %v, want a", in)
	}
}
