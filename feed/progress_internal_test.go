package feed

import (
	"context"
	"testing"
	"time"

	"github.com/stockctl/stockctl/coordinator"
	"github.com/stockctl/stockctl/internal/etcdtest"
)

// A progress report moves a following feed's cursor, as an empty batch,
// past revisions in which nothing in its scope changed; the next event
// still comes. etcd sends such reports every 10 minutes by itself; here
// the test asks for one, which a current etcd answers the same way.
func TestProgressMovesTheCursor(t *testing.T) {
	t.Parallel()
	e := etcdtest.NewSingle(t, etcdtest.WithNoFsync())
	client := e.Client(t)
	c, err := coordinator.New(client, coordinator.WithPrefix("/progress/"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	for _, sku := range []string{"tee", "mug"} {
		if _, err := c.CreateSKU(ctx, sku, coordinator.SKUConfig{Total: 10, Segments: 1, InitialFill: 10}); err != nil {
			t.Fatal(err)
		}
	}
	now, err := client.Get(ctx, "/progress/")
	if err != nil {
		t.Fatal(err)
	}
	// From the current revision: etcd answers a progress request only for a
	// watch that has caught up (a feed with an end asks until it has).
	f, err := Open(ctx, client, Config{Prefix: "/progress/", SKU: "tee", Since: now.Header.Revision})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	start := f.Cursor()
	f.watch = f.startWatch()
	if b, err := f.watch.next(ctx, f); err != nil || f.Cursor() != start || len(b.Events) != 0 {
		t.Fatalf("the watch's first response: %+v, %v; want its creation", b, err)
	}
	mug, err := c.Allocate(ctx, "mug", "m-1", 1, "x")
	if err != nil {
		t.Fatal(err)
	}
	if err := f.w.RequestProgress(f.watch.ctx); err != nil {
		t.Fatal(err)
	}
	b, err := f.Next(ctx)
	if err != nil || len(b.Events) != 0 || b.Cursor < mug.Revision || f.Cursor() != b.Cursor {
		t.Fatalf("after a progress report: %+v, %v; want an empty batch at %d or later", b, err, mug.Revision)
	}
	tee, err := c.Allocate(ctx, "tee", "t-1", 1, "x")
	if err != nil {
		t.Fatal(err)
	}
	b, err = f.Next(ctx)
	if err != nil || len(b.Events) != 1 || b.Events[0].Revision != tee.Revision || b.Cursor != tee.Revision {
		t.Fatalf("the next event: %+v, %v; want t-1 at %d", b, err, tee.Revision)
	}
}
