package coordinator_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/stockctl/stockctl/coordinator"
	"github.com/stockctl/stockctl/feed"
	"github.com/stockctl/stockctl/internal/etcdtest"
)

// fleetRecordOf reads tc's fleet record directly.
func fleetRecordOf(t *testing.T, tc *testCluster) (rec struct {
	Cluster  string   `json:"cluster"`
	Clusters []string `json:"clusters"`
	Locks    []string `json:"locks"`
	Removed  bool     `json:"removed"`
}) {
	t.Helper()
	resp, err := tc.raw.Get(t.Context(), coordinator.DefaultPrefix+"fleet")
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) == 0 {
		t.Fatalf("cluster %s has no fleet record", tc.name)
	}
	if err := json.Unmarshal(resp.Kvs[0].Value, &rec); err != nil {
		t.Fatal(err)
	}
	return rec
}

// lockIn takes, through c, a lock whose name is placed in cluster want,
// and returns it with its name.
func lockIn(t *testing.T, c *coordinator.Coordinator, want string) (*coordinator.Lock, string) {
	t.Helper()
	ctx := t.Context()
	for i := range 64 {
		name := fmt.Sprintf("job-%d", i)
		l, err := c.Lock(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		ls, _, err := c.Locks(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range ls {
			if s.Name == name && s.Cluster == want {
				return l, name
			}
		}
		if err := l.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	}
	t.Fatalf("no lock name of 64 is placed in cluster %s", want)
	return nil, ""
}

// createByName creates 12 SKUs named prefix0 ... through c, placed by
// their names: none may land in cluster c (being removed, or removed).
func createByName(t *testing.T, c *coordinator.Coordinator, tcs []*testCluster, prefix string, cfg coordinator.SKUConfig) {
	t.Helper()
	moved := 0
	for i := range 12 {
		sku := fmt.Sprintf("%s%d", prefix, i)
		if _, err := c.CreateSKU(t.Context(), sku, cfg); err != nil {
			t.Fatalf("create %s by its name: %v", sku, err)
		}
		in := metaIn(t, tcs, sku)
		if len(in) != 1 || in[0] == "c" {
			t.Fatalf("%s was created in %v", sku, in)
		}
		if where, err := c.ClusterOf(t.Context(), sku); err != nil || where != in[0] {
			t.Fatalf("%s: found in %q (%v), etcd has it in %v", sku, where, err, in)
		}
		if coordinator.RendezvousForTest([]string{"a", "b", "c"}, sku) == "c" {
			moved++
		}
	}
	if moved == 0 {
		t.Fatalf("none of %s0..%s11 hashes to c: the test shows nothing", prefix, prefix)
	}
	t.Logf("%s0..%s11: %d names hash to c and were placed elsewhere", prefix, prefix, moved)
}

// Removing a cluster: refused while it holds a SKU (naming it), and for
// the registry; once its SKU is drained and deleted, removed: the other
// clusters' records list the fleet without it, its own says removed, a
// process that still runs with the old list sells on but creates nothing
// in it, a process started with the old list is refused, one started
// with the new list serves every SKU. A lock cluster is removed only with
// MoveLocks, once no SKU, lock or other process's lease is left in it,
// and its lock names then live in the remaining lock cluster. A merged
// feed's cursor naming a removed cluster is refused, naming it.
func TestRemoveCluster(t *testing.T) {
	tcs := newTestClusters(t, "a", "b", "c")
	ctx := t.Context()
	cfg := coordinator.SKUConfig{Total: 50, Segments: 2, InitialFill: 20}
	first := mustFleet(t, tcs[:2]) // the lock clusters: a and b
	c1 := mustFleet(t, tcs)        // c added: not a lock cluster
	for _, p := range [][2]string{{"c", "x"}, {"a", "y"}, {"b", "z"}} {
		if _, err := c1.CreateSKUIn(ctx, p[0], p[1], cfg); err != nil {
			t.Fatal(err)
		}
	}
	seller := mustFleet(t, tcs)
	if _, err := seller.Allocate(ctx, "x", "o1", 2, "u"); err != nil {
		t.Fatal(err)
	}
	seller.Close() // its segment locks go with it

	var bad *coordinator.ClusterInUseError
	if _, err := c1.RemoveCluster(ctx, "a", coordinator.RemoveClusterOptions{}); !errors.Is(err, coordinator.ErrInvalidArgument) {
		t.Fatalf("remove the registry: %v, want ErrInvalidArgument", err)
	}
	if _, err := c1.RemoveCluster(ctx, "nope", coordinator.RemoveClusterOptions{}); !errors.Is(err, coordinator.ErrInvalidArgument) {
		t.Fatalf("remove an unknown cluster: %v, want ErrInvalidArgument", err)
	}
	_, err := c1.RemoveCluster(ctx, "c", coordinator.RemoveClusterOptions{})
	if !errors.As(err, &bad) || !errors.Is(err, coordinator.ErrConflict) || !slices.Equal(bad.SKUs, []string{"x"}) ||
		!strings.Contains(err.Error(), "x") {
		t.Fatalf("remove c holding x: %v (%+v), want a ClusterInUseError naming x", err, bad)
	}
	// Refused, it left nothing behind: creations in c go on.
	if resp, err := tcs[0].raw.Get(ctx, coordinator.DefaultPrefix+"removed/", clientv3.WithPrefix()); err != nil || len(resp.Kvs) != 0 {
		t.Fatalf("a refused removal left a record: %v %v", resp, err)
	}
	if _, err := c1.CreateSKUIn(ctx, "c", "x2", cfg); err != nil {
		t.Fatalf("create in c after a refused removal: %v", err)
	}
	// Draining: refused, naming both, but begun: nothing is created in c
	// from then on, and names that hash to c are placed elsewhere.
	_, err = c1.RemoveCluster(ctx, "c", coordinator.RemoveClusterOptions{Drain: true})
	if !errors.As(err, &bad) || !slices.Equal(bad.SKUs, []string{"x", "x2"}) || !bad.Draining || !strings.Contains(err.Error(), "draining") {
		t.Fatalf("remove c holding x and x2, draining: %v, want both named", err)
	}
	if _, err := c1.CreateSKUIn(ctx, "c", "w", cfg); !errors.Is(err, coordinator.ErrConflict) || !strings.Contains(err.Error(), "being removed") {
		t.Fatalf("create in draining c: %v, want ErrConflict saying it is being removed", err)
	}
	createByName(t, c1, tcs, "h", cfg)
	var lastDelete int64 // c's last order change is at x's delete or before (its archive step)
	for _, sku := range []string{"x", "x2"} {
		d, err := c1.DeleteSKU(ctx, sku)
		if err != nil {
			t.Fatalf("delete %s: %v", sku, err)
		}
		if sku == "x" {
			lastDelete = d.Revision // x2 has no order
		}
	}
	r, err := c1.RemoveCluster(ctx, "c", coordinator.RemoveClusterOptions{})
	if err != nil {
		t.Fatalf("remove c, empty: %v", err)
	}
	if r.Cluster != "c" || r.Revision == 0 || !slices.Equal(r.Clusters, []string{"a", "b"}) || !slices.Equal(r.Locks, []string{"a", "b"}) ||
		r.LockCluster || len(r.Unrewritten) != 0 || r.FeedEnd == 0 || r.FeedEnd > lastDelete {
		t.Fatalf("removal: %+v, want its feed ending by x's delete, %d", r, lastDelete)
	}
	rc := r
	for _, tc := range tcs[:2] {
		if rec := fleetRecordOf(t, tc); !slices.Equal(rec.Clusters, []string{"a", "b"}) || rec.Removed {
			t.Fatalf("cluster %s's record after the removal: %+v", tc.name, rec)
		}
	}
	if rec := fleetRecordOf(t, tcs[2]); !rec.Removed {
		t.Fatalf("c's record does not say removed: %+v", rec)
	}

	// A process still running with the old list sells on, and creates
	// nothing in c: explicitly refused, by name never placed there.
	if _, err := c1.Allocate(ctx, "y", "o1", 1, "u"); err != nil {
		t.Fatal(err)
	}
	if _, err := c1.CreateSKUIn(ctx, "c", "w", cfg); !errors.Is(err, coordinator.ErrConflict) || !strings.Contains(err.Error(), "removed") {
		t.Fatalf("create in removed c: %v, want ErrConflict saying it was removed", err)
	}
	createByName(t, c1, tcs, "k", cfg)

	// Processes started with the old list (or with c added again) are
	// refused; with the new list they serve.
	if _, err := newFleet(t, ctx, tcs); !errors.Is(err, coordinator.ErrFleetMismatch) || !strings.Contains(err.Error(), "removed") {
		t.Fatalf("a process with the old list: %v, want ErrFleetMismatch saying c was removed", err)
	}
	c2 := mustFleet(t, tcs[:2])
	for sku, want := range map[string]string{"y": "a", "z": "b"} {
		if got, err := c2.ClusterOf(ctx, sku); err != nil || got != want {
			t.Fatalf("%s: in %q (%v), want %s", sku, got, err, want)
		}
		if _, err := c2.Allocate(ctx, sku, "o2", 1, "u"); err != nil {
			t.Fatal(err)
		}
		mustAudit(t, c2, sku)
	}

	// b is a lock cluster: only with MoveLocks, and not while z, a lock or
	// another process's lease is in it.
	if _, err := c2.RemoveCluster(ctx, "b", coordinator.RemoveClusterOptions{}); !errors.Is(err, coordinator.ErrInvalidArgument) ||
		!strings.Contains(err.Error(), "lock cluster") {
		t.Fatalf("remove lock cluster b without MoveLocks: %v", err)
	}
	inB := []string{"z"}
	for i := range 12 {
		for _, p := range []string{"h", "k"} {
			if sku := fmt.Sprintf("%s%d", p, i); slices.Contains(metaIn(t, tcs, sku), "b") {
				inB = append(inB, sku)
			}
		}
	}
	slices.Sort(inB)
	l, lname := lockIn(t, c2, "b")
	move := coordinator.RemoveClusterOptions{MoveLocks: true}
	if _, err := c2.RemoveCluster(ctx, "b", move); !errors.As(err, &bad) || !slices.Equal(bad.SKUs, inB) ||
		!slices.Equal(bad.Locks, []string{lname}) {
		t.Fatalf("remove b holding %v and lock %s: %v", inB, lname, err)
	}
	if err := l.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	for _, sku := range inB {
		if _, err := c2.DeleteSKU(ctx, sku); err != nil {
			t.Fatal(err)
		}
	}
	// first holds a lease in b (its lock session).
	fl, _ := lockIn(t, first, "b")
	if err := fl.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := c2.RemoveCluster(ctx, "b", move); !errors.Is(err, coordinator.ErrConflict) || !strings.Contains(err.Error(), "lease") {
		t.Fatalf("remove b while another process has a lease there: %v", err)
	}
	first.Close()
	c1.Close()
	r, err = c2.RemoveCluster(ctx, "b", move)
	if err != nil {
		t.Fatalf("remove b, empty, every other process stopped: %v", err)
	}
	if !r.LockCluster || !slices.Equal(r.Clusters, []string{"a"}) || !slices.Equal(r.Locks, []string{"a"}) {
		t.Fatalf("removal of b: %+v", r)
	}
	c2.Close()
	c3 := mustFleet(t, tcs[:1])
	// The lock name that lived in b now lives in a.
	l3, err := c3.Lock(ctx, lname)
	if err != nil {
		t.Fatal(err)
	}
	if ls, _, err := c3.Locks(ctx); err != nil || len(ls) != 1 || ls[0].Name != lname || ls[0].Cluster != "a" {
		t.Fatalf("lock %s after b's removal: %+v (%v), want it in a", lname, ls, err)
	}
	if err := l3.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := c3.Allocate(ctx, "y", "o3", 1, "u"); err != nil {
		t.Fatal(err)
	}
	mustAudit(t, c3, "y")

	// The merged feed: a cursor that would skip a removed cluster's events
	// is refused, naming it; one at or past both removals resumes, and so
	// does an empty one, their cursors carrying the removed clusters.
	removedAt, err := c3.RemovedClusters(ctx)
	if err != nil || len(removedAt) != 2 || removedAt["b"] != r.FeedEnd || r.FeedEnd == 0 || removedAt["c"] != rc.FeedEnd {
		t.Fatalf("RemovedClusters: %v %v, want b's feed end %d and c's %d", removedAt, err, r.FeedEnd, rc.FeedEnd)
	}
	only := []coordinator.Cluster{{Name: "a", Client: tcs[0].raw}}
	cfgFeed := feed.Config{Removed: removedAt, UntilOpen: true}
	for _, bad := range []feed.Cursor{
		{"a": 1, "b": removedAt["b"], "c": removedAt["c"] - 1}, // c's last events unread
		{"a": 1, "b": removedAt["b"]},                          // c never read
	} {
		_, err := feed.OpenMerged(only, cfgFeed, bad)
		if !errors.Is(err, feed.ErrInvalidArgument) || !strings.Contains(err.Error(), `"c"`) || !strings.Contains(err.Error(), "removed") {
			t.Fatalf("merged feed from %s: %v, want ErrInvalidArgument naming removed c", bad, err)
		}
	}
	if _, err := feed.OpenMerged(only, feed.Config{}, feed.Cursor{"a": 1, "c": 2}); !errors.Is(err, feed.ErrInvalidArgument) ||
		!strings.Contains(err.Error(), "Config.Removed") {
		t.Fatalf("merged feed without Removed, from a cursor naming c: %v", err)
	}
	// A consumer that followed c to its end has a cursor at its feed's
	// end: it resumes.
	fc, err := feed.Open(ctx, tcs[2].raw, feed.Config{})
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, etcdtest.MinWait)
	var cAt int64
	for cAt < rc.FeedEnd {
		b, err := fc.Next(wctx)
		if err != nil {
			t.Fatalf("c's feed up to %d: at %d: %v", rc.FeedEnd, cAt, err)
		}
		cAt = b.Cursor
	}
	cancel()
	fc.Close()
	if cAt != rc.FeedEnd {
		t.Fatalf("a consumer that followed c has cursor %d, past its feed's end %d", cAt, rc.FeedEnd)
	}
	want := fmt.Sprintf("b=%d,c=%d", removedAt["b"], removedAt["c"])
	for _, since := range []feed.Cursor{{}, {"a": 0, "b": removedAt["b"], "c": cAt}} {
		m, err := feed.OpenMerged(only, cfgFeed, since)
		if err != nil {
			t.Fatalf("merged feed from %s: %v", since, err)
		}
		got := 0
		for range 1000 {
			b, err := m.Next(ctx)
			if err != nil {
				break
			}
			got += len(b.Events)
			if !strings.Contains(b.Merged, fmt.Sprintf("b=%d", removedAt["b"])) || !strings.Contains(b.Merged, "c=") {
				t.Fatalf("a batch's merged cursor %q does not carry the removed clusters", b.Merged)
			}
		}
		m.Close()
		if got == 0 {
			t.Fatalf("merged feed from %s: no event of a", since)
		}
		t.Logf("merged feed from %q: %d events of a; cursor carries %s", since, got, want)
	}
}

// A removal racing creations and deletes in the cluster: it is refused
// while any SKU is there, and once it is done nothing is ever created
// there again; every creation either succeeded before it or was refused
// with ErrConflict, and the cluster ends with no SKU and no claim naming it.
func TestRemoveClusterRacesCreations(t *testing.T) {
	tcs := newTestClusters(t, "a", "b", "c")
	ctx := t.Context()
	cfg := coordinator.SKUConfig{Total: 10, Segments: 1, InitialFill: 10}
	mustFleet(t, tcs[:2]) // lock clusters a and b: c is removed without MoveLocks
	remover := mustFleet(t, tcs)
	const creators, rounds = 2, 30
	var wg sync.WaitGroup
	var created, refused atomic.Int64
	errs := make(chan error, creators*rounds*2)
	for i := range creators {
		p := mustFleet(t, tcs)
		wg.Go(func() {
			for j := range rounds {
				sku := fmt.Sprintf("r%d-%d", i, j)
				if _, err := p.CreateSKUIn(ctx, "c", sku, cfg); err != nil {
					if !errors.Is(err, coordinator.ErrConflict) {
						errs <- fmt.Errorf("create %s: %w", sku, err)
					}
					refused.Add(1)
					continue
				}
				created.Add(1)
				if _, err := p.DeleteSKU(ctx, sku); err != nil {
					errs <- fmt.Errorf("delete %s: %w", sku, err)
				}
			}
		})
	}
	var removed *coordinator.ClusterRemoval
	refusals := 0
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	for running := true; running && removed == nil; {
		select {
		case <-done:
			running = false
		default:
		}
		r, err := remover.RemoveCluster(ctx, "c", coordinator.RemoveClusterOptions{})
		switch {
		case err == nil:
			removed = &r
		case errors.Is(err, coordinator.ErrConflict):
			refusals++
		default:
			t.Fatalf("remove c: %v", err)
		}
	}
	midRace := removed != nil
	<-done
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if removed == nil {
		r, err := remover.RemoveCluster(ctx, "c", coordinator.RemoveClusterOptions{})
		if err != nil {
			t.Fatalf("remove c once the creators are done (every SKU deleted): %v", err)
		}
		removed = &r
	}
	t.Logf("removed mid-race: %v, after %d refusals; %d SKUs created in c and deleted, %d creations refused",
		midRace, refusals, created.Load(), refused.Load())
	metas, err := tcs[2].raw.Get(ctx, coordinator.DefaultPrefix+"meta/", clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil || len(metas.Kvs) != 0 {
		t.Fatalf("c holds SKUs after its removal: %v %v", metas.Kvs, err)
	}
	// Nothing but its fleet record (marked removed) was written in c after
	// the removal's revision: etcd's history of every key under the
	// prefix says so.
	fleet, err := tcs[2].raw.Get(ctx, coordinator.DefaultPrefix+"fleet")
	if err != nil || len(fleet.Kvs) != 1 || fleet.Kvs[0].ModRevision <= removed.Revision {
		t.Fatalf("c's fleet record after its removal: %v %v", fleet.Kvs, err)
	}
	if n := keysWritten(t, tcs[2].raw, coordinator.DefaultPrefix, removed.Revision, fleet.Header.Revision); n != 1 {
		t.Fatalf("%d keys were written in c after its removal (revision %d), want 1 (its fleet record)", n, removed.Revision)
	}
	claims, err := tcs[0].raw.Get(ctx, coordinator.DefaultPrefix+"placement/", clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	for _, kv := range claims.Kvs {
		if strings.Contains(string(kv.Value), `"c"`) {
			t.Fatalf("a claim names removed c: %s = %s", kv.Key, kv.Value)
		}
	}
	if _, err := remover.CreateSKUIn(ctx, "c", "after", cfg); !errors.Is(err, coordinator.ErrConflict) {
		t.Fatalf("create in c after its removal: %v", err)
	}
}

// The end of a removed cluster's order feed when its history was
// compacted past its last order change: the compacted revision (no order
// change can be after it), never a revision below a change.
func TestRemoveClusterAfterCompaction(t *testing.T) {
	tcs := newTestClusters(t, "a", "b", "c")
	ctx := t.Context()
	mustFleet(t, tcs[:2])
	c := mustFleet(t, tcs)
	if _, err := c.CreateSKUIn(ctx, "c", "x", coordinator.SKUConfig{Total: 10, Segments: 1, InitialFill: 10}); err != nil {
		t.Fatal(err)
	}
	seller := mustFleet(t, tcs)
	if _, err := seller.Allocate(ctx, "x", "o1", 1, "u"); err != nil {
		t.Fatal(err)
	}
	seller.Close()
	d, err := c.DeleteSKU(ctx, "x")
	if err != nil {
		t.Fatal(err)
	}
	at, err := tcs[2].raw.Get(ctx, "rev")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tcs[2].raw.Compact(ctx, at.Header.Revision); err != nil {
		t.Fatal(err)
	}
	r, err := c.RemoveCluster(ctx, "c", coordinator.RemoveClusterOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if r.FeedEnd != at.Header.Revision || r.FeedEnd < d.Revision {
		t.Fatalf("feed end %d after compaction at %d (x deleted at %d), want the compacted revision", r.FeedEnd, at.Header.Revision, d.Revision)
	}
}
