package feed_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/stockctl/stockctl/coordinator"
	"github.com/stockctl/stockctl/feed"
	"github.com/stockctl/stockctl/internal/etcdtest"
	"github.com/stockctl/stockctl/rebalance"
)

// outcomes collects the transitions the sale's calls report, as "revision
// kind sku/order", the same shape as short.
type outcomes struct {
	mu   sync.Mutex
	seen map[string]bool
	errs int
	// abandoned are the reservations left to expire, with their deadlines.
	abandoned map[[2]string]time.Time
}

func (o *outcomes) abandon(sku, order string, deadline time.Time) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.abandoned[[2]string{sku, order}] = deadline
}

func (o *outcomes) add(rev int64, kind feed.Kind, sku, order string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.seen[fmt.Sprintf("%d %s %s/%s", rev, kind, sku, order)] = true
}

func (o *outcomes) failed() {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.errs++
}

// follower runs a live feed in the background and hands its batches to
// the test.
type follower struct {
	batches chan feed.Batch
	done    chan error
}

func follow(ctx context.Context, t *testing.T, client *clientv3.Client, cfg feed.Config) *follower {
	t.Helper()
	f, err := feed.Open(ctx, client, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return followFeed(ctx, f)
}

// until reads the follower's batches until one reaches rev.
func (fl *follower) until(t *testing.T, rev int64) []feed.Event {
	t.Helper()
	var out []feed.Event
	timeout := time.After(hang)
	for {
		select {
		case b, ok := <-fl.batches:
			if !ok {
				t.Fatalf("feed ended before revision %d: %v", rev, <-fl.done)
			}
			checkBatch(t, b, out)
			out = append(out, b.Events...)
			if b.Cursor >= rev {
				return out
			}
		case <-timeout:
			t.Fatalf("feed did not reach revision %d within %v (delivered %d events)", rev, hang, len(out))
		}
	}
}

// A sale of allocations, reservations, confirms, cancels, releases and
// expiries on three coordinators (each its own etcd client, as if its own
// process) and an elected rebalancer sweeping expiries, fed live to two
// feeds: the feeds deliver in order, with no gap and no duplicate, exactly
// the history of the order records, and every transition a call reported.
func TestConcurrentSale(t *testing.T) {
	t.Parallel()
	e := etcdtest.NewSingle(t, etcdtest.WithNoFsync())
	const prefix = "/sale/"
	skus := []string{"tee", "mug"}
	var coords []*coordinator.Coordinator
	for range 3 {
		coords = append(coords, newCoordinator(t, e.Client(t), prefix))
	}
	for _, sku := range skus {
		createSKU(t, coords[0], sku, 10_000, 4)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*hang)
	defer cancel()
	reader := e.Client(t)
	all := follow(ctx, t, reader, feed.Config{Prefix: prefix})
	tee := follow(ctx, t, reader, feed.Config{Prefix: prefix, SKU: "tee"})

	got := &outcomes{seen: map[string]bool{}, abandoned: map[[2]string]time.Time{}}
	r, err := rebalance.New(coords[0], rebalance.Config{ExpiryPoll: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	rctx, stopRebalancer := context.WithCancel(ctx)
	rdone := make(chan struct{})
	go func() {
		defer close(rdone)
		_ = r.Run(rctx)
	}()
	defer func() { stopRebalancer(); <-rdone }()

	const workers, orders = 6, 25
	var wg sync.WaitGroup
	for w := range len(coords) * workers {
		wg.Go(func() {
			c := coords[w%len(coords)]
			rng := rand.New(rand.NewPCG(uint64(w), 22))
			for i := range orders {
				sku := skus[rng.IntN(len(skus))]
				id := fmt.Sprintf("w%d-%d", w, i)
				saleStep(ctx, c, rng, got, sku, id)
			}
		})
	}
	wg.Wait()
	// The abandoned reservations expire by the rebalancer's sweep (in
	// batches), or by a Confirm after their deadline, which expires one
	// itself if the sweep has not yet: either way it says at which
	// revision.
	for key, deadline := range got.abandoned {
		time.Sleep(time.Until(deadline))
		_, err := coords[1].Confirm(ctx, key[0], key[1])
		var x *coordinator.ExpiredError
		if !errors.As(err, &x) {
			t.Fatalf("confirm of %s/%s after its deadline: %v, want an *ExpiredError", key[0], key[1], err)
		}
		got.add(x.Revision, feed.Expired, key[0], key[1])
	}
	stopRebalancer()
	<-rdone

	hist, _ := history(t, reader, prefix, "")
	teeHist, _ := history(t, reader, prefix, "tee")
	last := hist[len(hist)-1].Revision
	sameLines(t, "all SKUs, live", lines(all.until(t, last)), lines(hist))
	sameLines(t, "tee, live", lines(tee.until(t, teeHist[len(teeHist)-1].Revision)), lines(teeHist))

	kinds := map[feed.Kind]int{}
	fed := map[string]bool{}
	for _, s := range short(hist) {
		fed[s] = true
	}
	for _, ev := range hist {
		kinds[ev.Kind]++
	}
	for s := range got.seen {
		if !fed[s] {
			t.Errorf("a call reported %q; the feed has no such event", s)
		}
	}
	if got.errs == 0 && len(got.seen) != len(hist) {
		t.Errorf("calls reported %d transitions, the feed has %d", len(got.seen), len(hist))
	}
	for _, k := range feed.Kinds {
		if kinds[k] == 0 {
			t.Errorf("the sale made no %s event: %v", k, kinds)
		}
	}
	shared := map[int64]int{}
	for _, ev := range hist {
		shared[ev.Revision]++
	}
	multi := 0
	for _, n := range shared {
		if n > 1 {
			multi++
		}
	}
	t.Logf("%d events (%v) in %d revisions, %d of them with several events; %d calls failed",
		len(hist), kinds, len(shared), multi, got.errs)
}

// saleStep places one order and takes it through a random path of its
// lifecycle, recording what each call reports.
func saleStep(ctx context.Context, c *coordinator.Coordinator, rng *rand.Rand, got *outcomes, sku, id string) {
	record := func(rev int64, kind feed.Kind, err error) bool {
		var x *coordinator.ExpiredError
		switch {
		case errors.As(err, &x):
			got.add(x.Revision, feed.Expired, sku, id)
			return false
		case err != nil:
			got.failed()
			return false
		}
		got.add(rev, kind, sku, id)
		return true
	}
	back := func(kind feed.Kind, f func(context.Context, string, string) (*coordinator.Released, error)) {
		r, err := f(ctx, sku, id)
		if err == nil && !r.Released {
			return
		}
		record(revOf(r), kind, err)
	}
	buyer := coordinator.WithBuyer(fmt.Sprintf("b%d", rng.IntN(50)))
	if rng.IntN(10) < 3 {
		a, err := c.Allocate(ctx, sku, id, 1+rng.Int64N(2), id, buyer)
		if record(allocRev(a), feed.Allocated, err) && rng.IntN(10) < 3 {
			back(feed.Released, c.Release)
		}
		return
	}
	path := rng.IntN(100)
	ttl := time.Hour
	switch {
	case path >= 85:
		ttl = time.Millisecond // a Confirm that races its expiry
	case path >= 60:
		ttl = 50 * time.Millisecond // abandoned: the sweep expires it
	}
	a, err := c.Reserve(ctx, sku, id, 1, id, ttl, buyer)
	if !record(allocRev(a), feed.Reserved, err) {
		return
	}
	switch {
	case path >= 60 && path < 85:
		got.abandon(sku, id, a.Deadline)
	case path < 35 || path >= 85:
		cf, err := c.Confirm(ctx, sku, id)
		var rev int64
		if cf != nil {
			rev = cf.Revision
		}
		if record(rev, feed.Confirmed, err) && rng.IntN(10) < 3 {
			back(feed.Released, c.Release)
		}
	case path < 48:
		back(feed.Cancelled, c.Cancel)
	case path < 60:
		back(feed.Cancelled, c.Release) // Release of a live reservation
	}
}

func allocRev(a *coordinator.Allocation) int64 {
	if a == nil {
		return 0
	}
	return a.Revision
}

func revOf(r *coordinator.Released) int64 {
	if r == nil {
		return 0
	}
	return r.Revision
}
