package feed_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/stockctl/stockctl/coordinator"
	"github.com/stockctl/stockctl/feed"
	"github.com/stockctl/stockctl/internal/etcdtest"
	"github.com/stockctl/stockctl/internal/keys"
)

// allocator places plain orders o-0, o-1, ... from several goroutines
// until stopped, each retried under its own ID until it commits (a retry
// of an order that did commit replays it), so that a fault never loses or
// doubles one.
type allocator struct {
	next atomic.Int64
	stop chan struct{}
	wg   sync.WaitGroup
}

func allocate(t *testing.T, c *coordinator.Coordinator, sku string, goroutines int) *allocator {
	a := &allocator{stop: make(chan struct{})}
	for range goroutines {
		a.wg.Go(func() {
			for {
				select {
				case <-a.stop:
					return
				default:
				}
				id := fmt.Sprintf("o-%d", a.next.Add(1))
				for {
					ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
					_, err := c.Allocate(ctx, sku, id, 1, id)
					cancel()
					if err == nil {
						break
					}
					select {
					case <-a.stop:
						// Whether it committed is left to the record: the
						// expectation is read from etcd.
						return
					case <-time.After(20 * time.Millisecond):
					}
				}
			}
		})
	}
	t.Cleanup(a.halt)
	return a
}

func (a *allocator) halt() {
	select {
	case <-a.stop:
	default:
		close(a.stop)
	}
	a.wg.Wait()
}

// allocated is what a feed of sku must deliver when every order was a
// plain allocation (one version per record): each record as an allocated
// event at its revision. Read from the records, it survives compaction.
func allocated(t *testing.T, client *clientv3.Client, prefix, sku string) []feed.Event {
	t.Helper()
	snap, err := feed.Snapshot(t.Context(), client, feed.Config{Prefix: prefix, SKU: sku})
	if err != nil {
		t.Fatal(err)
	}
	space, _ := keys.New(prefix)
	resp, err := client.Get(t.Context(), space.Orders(sku), clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		t.Fatal(err)
	}
	if int64(len(snap.Events)) != resp.Count {
		t.Fatalf("snapshot has %d orders, etcd %d", len(snap.Events), resp.Count)
	}
	for _, e := range snap.Events {
		if e.Kind != feed.Allocated || e.Version != 1 {
			t.Fatalf("order %s is not a plain allocation written once: %s", e.Order, line(e))
		}
	}
	return snap.Events
}

// waitEvents reads the follower's batches until n more events came.
func (fl *follower) waitEvents(t *testing.T, got *[]feed.Event, n int) {
	t.Helper()
	want := len(*got) + n
	timeout := time.After(hang)
	for len(*got) < want {
		select {
		case b, ok := <-fl.batches:
			if !ok {
				t.Fatalf("feed ended: %v", <-fl.done)
			}
			checkBatch(t, b, *got)
			*got = append(*got, b.Events...)
		case <-timeout:
			t.Fatalf("%d events within %v, want %d", len(*got), hang, want)
		}
	}
}

// A compaction up to the feed's cursor, then a member restart that breaks
// its watch: the feed resumes right at the compaction and misses nothing.
// A compaction past a stored cursor is a *CompactedError, and a snapshot
// then a feed from it give every order again.
func TestCompactionMidFeed(t *testing.T) {
	t.Parallel()
	e := etcdtest.NewSingle(t, etcdtest.WithNoFsync())
	const prefix = "/compact/"
	c := newCoordinator(t, e.Client(t), prefix)
	createSKU(t, c, "tee", 100_000, 4)
	a := allocate(t, c, "tee", 6)

	ctx, cancel := context.WithTimeout(context.Background(), hang)
	defer cancel()
	reader := e.Client(t)
	f, err := feed.Open(ctx, reader, feed.Config{Prefix: prefix, SKU: "tee"})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var got []feed.Event
	next := func() {
		b, err := f.Next(ctx)
		if err != nil {
			t.Fatalf("next after %d events: %v", len(got), err)
		}
		checkBatch(t, b, got)
		got = append(got, b.Events...)
	}
	for len(got) < 50 {
		next()
	}
	// Compact right after the cursor: nothing the feed still needs goes.
	cursor := f.Cursor()
	if _, err := reader.Put(ctx, "/elsewhere", "x"); err != nil { // so that cursor+1 exists
		t.Fatal(err)
	}
	if _, err := reader.Compact(ctx, cursor+1, clientv3.WithCompactPhysical()); err != nil {
		t.Fatal(err)
	}
	e.Restart(t)
	// A feed opened at the cursor after the compaction starts right at it.
	again, err := feed.Open(ctx, reader, feed.Config{Prefix: prefix, SKU: "tee", Since: cursor})
	if err != nil {
		t.Fatal(err)
	}
	defer again.Close()
	for n := len(got); len(got) < n+50; {
		next()
	}
	a.halt()
	want := allocated(t, reader, prefix, "tee")
	last := want[len(want)-1].Revision
	for f.Cursor() < last {
		next()
	}
	sameLines(t, "through a compaction and a restart", lines(got), lines(want))

	var resumed []feed.Event
	for again.Cursor() < last {
		b, err := again.Next(ctx)
		if err != nil {
			t.Fatalf("the feed opened at the compaction: %v", err)
		}
		resumed = append(resumed, b.Events...)
	}
	sameLines(t, "opened at the compaction", lines(resumed), lines(after(want, cursor)))

	// A stored cursor the next compaction passes.
	if _, err := reader.Compact(ctx, last); err != nil {
		t.Fatal(err)
	}
	old, err := feed.Open(ctx, reader, feed.Config{Prefix: prefix, SKU: "tee", Since: cursor})
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close()
	var ce *feed.CompactedError
	if _, err := old.Next(ctx); !errors.As(err, &ce) || ce.CompactRevision != last || ce.Cursor != cursor {
		t.Fatalf("a cursor before the compaction: %v, want a *CompactedError at %d", err, last)
	}
	snap, err := feed.Snapshot(ctx, reader, feed.Config{Prefix: prefix, SKU: "tee"})
	if err != nil {
		t.Fatal(err)
	}
	sameLines(t, "the snapshot", lines(snap.Events), lines(want))
}

// A 3-member cluster: the feed's only member restarts, then loses its
// leader (the two others stop) and gets it back, and history is compacted
// up to what the feed delivered, while orders are placed throughout. The
// feed opens its watch again as needed and delivers every order once, in
// order.
func TestClusterFaults(t *testing.T) {
	t.Parallel()
	cl := etcdtest.NewCluster(t, 3, etcdtest.WithNoFsync())
	const prefix = "/cluster/"
	c := newCoordinator(t, cl.Client(t), prefix)
	createSKU(t, c, "tee", 100_000, 4)
	reader := etcdtest.NewClient(t, cl.Endpoints()[2])
	ctx, cancel := context.WithTimeout(context.Background(), 3*hang)
	defer cancel()
	f, err := feed.Open(ctx, reader, feed.Config{Prefix: prefix, SKU: "tee"})
	if err != nil {
		t.Fatal(err)
	}
	fl := followFeed(ctx, f)
	a := allocate(t, c, "tee", 4)
	var got []feed.Event
	fl.waitEvents(t, &got, 30)

	cl.Restart(t, 2)
	fl.waitEvents(t, &got, 30)

	// Member 2 alone has no leader: etcd ends its watches (the feed asks
	// for a leader), and the feed opens its watch again until one is back.
	cl.Stop(0)
	cl.Stop(1)
	for f.Restarts() == 0 {
		select {
		case <-ctx.Done():
			t.Fatal("the feed never noticed its member lost the leader")
		case <-time.After(20 * time.Millisecond):
		}
	}
	cl.Restart(t, 0)
	cl.Restart(t, 1)
	cl.WaitHealthy(t)
	fl.waitEvents(t, &got, 30)

	if _, err := reader.Compact(ctx, got[len(got)-1].Revision); err != nil {
		t.Fatal(err)
	}
	cl.Restart(t, 2)
	fl.waitEvents(t, &got, 30)

	a.halt()
	want := allocated(t, reader, prefix, "tee")
	last := want[len(want)-1].Revision
	for len(got) == 0 || got[len(got)-1].Revision < last {
		fl.waitEvents(t, &got, 1)
	}
	sameLines(t, "through restarts, a lost leader and a compaction", lines(got), lines(want))
	t.Logf("%d orders; the feed opened its watch again %d times", len(want), f.Restarts())
}

// followFeed runs f in the background, handing its batches to the test.
func followFeed(ctx context.Context, f *feed.Feed) *follower {
	fl := &follower{batches: make(chan feed.Batch, 1<<14), done: make(chan error, 1)}
	go func() {
		defer f.Close()
		for {
			b, err := f.Next(ctx)
			if err != nil {
				fl.done <- err
				close(fl.batches)
				return
			}
			fl.batches <- b
		}
	}()
	return fl
}
