package feed_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/stockctl/stockctl/coordinator"
	"github.com/stockctl/stockctl/feed"
	"github.com/stockctl/stockctl/internal/etcdtest"
)

// The merged feed of two clusters, resumed from cursors taken before,
// during and after one cluster's outage, delivers every event once: what
// a resumed feed delivers and what was delivered up to its cursor are
// disjoint and together every event of both clusters. During the outage
// the other cluster's events keep coming. A cursor older than one
// cluster's compaction is reported as compacted, naming that cluster.
func TestMergedFeedAcrossAnOutage(t *testing.T) {
	ea, eb := etcdtest.NewSingle(t, etcdtest.WithNoFsync()), etcdtest.NewSingle(t, etcdtest.WithNoFsync())
	clusters := []coordinator.Cluster{{Name: "a", Client: ea.Client(t)}, {Name: "b", Client: eb.Client(t)}}
	ctx, cancel := context.WithTimeout(context.Background(), hang)
	defer cancel()
	co, err := coordinator.NewClusters(ctx, clusters)
	if err != nil {
		t.Fatal(err)
	}
	defer co.Close()
	for _, cl := range []string{"a", "b"} {
		if _, err := co.CreateSKUIn(ctx, cl, "m"+cl, coordinator.SKUConfig{Total: 1000, Segments: 2, InitialFill: 1000}); err != nil {
			t.Fatal(err)
		}
	}
	n := 0
	orders := func(cl string, k int) {
		t.Helper()
		for range k {
			n++
			id := fmt.Sprintf("o%d", n)
			if _, err := co.Allocate(ctx, "m"+cl, id, 1, id); err != nil {
				t.Fatalf("order %s in %s: %v", id, cl, err)
			}
			if n%3 == 0 {
				if _, err := co.Release(ctx, "m"+cl, id); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	orders("a", 6)
	orders("b", 6)

	// The follower: every batch, and what was delivered up to its cursor.
	follower, err := feed.OpenMerged(clusters, feed.Config{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer follower.Close()
	delivered := map[string]bool{}
	type mark struct {
		cursor string
		before map[string]bool
	}
	marks := []mark{{cursor: "", before: map[string]bool{}}}
	// follow reads until want holds of what was delivered.
	follow := func(what string, want func() bool) {
		t.Helper()
		for !want() {
			b, err := follower.Next(ctx)
			if err != nil {
				t.Fatalf("%s: %v", what, err)
			}
			for _, e := range b.Events {
				k := b.Cluster + " " + line(e)
				if delivered[k] {
					t.Fatalf("%s: %s delivered twice", what, k)
				}
				delivered[k] = true
			}
			marks = append(marks, mark{cursor: b.Merged, before: maps.Clone(delivered)})
		}
	}
	count := func(cl string) func(int) func() bool {
		return func(k int) func() bool {
			return func() bool {
				c := 0
				for key := range delivered {
					if key[:len(cl)+1] == cl+" " {
						c++
					}
				}
				return c >= k
			}
		}
	}
	all := func() map[string]bool {
		out := map[string]bool{}
		for _, c := range clusters {
			f, err := feed.Open(ctx, c.Client, feed.Config{UntilOpen: true})
			if err != nil {
				t.Fatal(err)
			}
			for _, e := range drain(t, f) {
				out[c.Name+" "+line(e)] = true
			}
			f.Close()
		}
		return out
	}
	before := all()
	follow("before the outage", func() bool { return len(delivered) == len(before) })

	// Cluster b stops: a's events still come.
	eb.Stop()
	aBefore := 0
	for k := range before {
		if k[0] == 'a' {
			aBefore++
		}
	}
	orders("a", 6)
	follow("during b's outage", count("a")(aBefore+6+2)) // 6 allocations, 2 releases
	during := len(marks) - 1
	eb.Restart(t)
	orders("b", 3)
	orders("a", 3)
	final := all()
	follow("after the outage", func() bool { return len(delivered) == len(final) })
	if !maps.Equal(delivered, final) {
		t.Fatalf("the follower delivered %d events, the clusters hold %d", len(delivered), len(final))
	}

	// Resume from cursors before, during and after the outage.
	for _, i := range []int{0, 1, len(marks) / 3, during, len(marks) - 2, len(marks) - 1} {
		m := marks[i]
		cur, err := feed.ParseCursor(m.cursor)
		if err != nil {
			t.Fatal(err)
		}
		r, err := feed.OpenMerged(clusters, feed.Config{UntilOpen: true}, cur)
		if err != nil {
			t.Fatal(err)
		}
		got := maps.Clone(m.before)
		for {
			b, err := r.Next(ctx)
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatalf("resumed from %q: %v", m.cursor, err)
			}
			for _, e := range b.Events {
				k := b.Cluster + " " + line(e)
				if got[k] {
					t.Fatalf("resumed from %q (mark %d): %s delivered again", m.cursor, i, k)
				}
				got[k] = true
			}
		}
		r.Close()
		if !maps.Equal(got, final) {
			t.Fatalf("resumed from %q (mark %d): %d events in all, want %d", m.cursor, i, len(got), len(final))
		}
	}

	// Cluster a compacted past an early cursor: reported, naming a.
	resp, err := clusters[0].Client.Get(ctx, "x")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := clusters[0].Client.Compact(ctx, resp.Header.Revision, clientv3.WithCompactPhysical()); err != nil {
		t.Fatal(err)
	}
	early, _ := feed.ParseCursor(marks[1].cursor)
	r, err := feed.OpenMerged(clusters, feed.Config{UntilOpen: true}, early)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	var cerr *feed.ClusterError
	for {
		_, err := r.Next(ctx)
		if errors.Is(err, io.EOF) {
			t.Fatal("a feed from a compacted cursor ended without saying so")
		}
		if err != nil {
			if !errors.As(err, &cerr) || cerr.Cluster != "a" || !errors.Is(err, feed.ErrCompacted) {
				t.Fatalf("from a compacted cursor: %v, want a compacted error naming cluster a", err)
			}
			break
		}
	}
	if _, err := feed.OpenMerged(clusters, feed.Config{}, feed.Cursor{"z": 1}); !errors.Is(err, feed.ErrInvalidArgument) {
		t.Fatalf("a cursor naming an unknown cluster: %v", err)
	}
}
