package feed_test

import (
	"fmt"
	"testing"

	"github.com/stockctl/stockctl/feed"
	"github.com/stockctl/stockctl/internal/etcdtest"
)

// The feed on a real etcd 3.4 server (Debian's etcd-server; skipped when no
// etcd binary is available), which stockctl supports: every kind of
// transition, a catch-up from every cursor (a catch-up leans on etcd's
// progress reports, which 3.4 servers before 3.4.25 answer differently),
// and a live feed.
func TestFeedOnEtcd34(t *testing.T) {
	t.Parallel()
	etcd := etcdtest.NewExternal(t, etcdtest.WithNoFsync())
	t.Logf("etcd %s", etcd.Version())
	client := etcd.Client(t)
	c := newCoordinator(t, client, "/v34/")
	want := script(t, c)

	all := openDrain(t, client, feed.Config{Prefix: "/v34/", UntilOpen: true})
	sameLines(t, "all SKUs vs the calls", short(all), want)
	hist, latest := history(t, client, "/v34/", "")
	sameLines(t, "all SKUs vs the records' versions", lines(all), lines(hist))
	for cursor := int64(0); cursor <= latest; cursor++ {
		got := openDrain(t, client, feed.Config{Prefix: "/v34/", SKU: "tee", Since: cursor, UntilOpen: true})
		var wantTee []string
		for _, e := range after(hist, cursor) {
			if e.SKU == "tee" {
				wantTee = append(wantTee, line(e))
			}
		}
		sameLines(t, fmt.Sprintf("tee since %d", cursor), lines(got), wantTee)
	}

	ctx := t.Context()
	f, err := feed.Open(ctx, client, feed.Config{Prefix: "/v34/", Since: latest})
	if err != nil {
		t.Fatal(err)
	}
	fl := followFeed(ctx, f)
	a, err := c.Allocate(ctx, "mug", "live-1", 1, "x")
	if err != nil {
		t.Fatal(err)
	}
	got := fl.until(t, a.Revision)
	if len(got) != 1 || got[0].Order != "live-1" || got[0].Revision != a.Revision {
		t.Fatalf("live: %v", short(got))
	}
}
