package e2e

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/stockctl/stockctl/coordinator"
	"github.com/stockctl/stockctl/feed"
	"github.com/stockctl/stockctl/internal/etcdtest"
	"github.com/stockctl/stockctl/rebalance"
)

// xcartLines are the lines of the helper's n-th order on a route.
func xcartLines(skus []string, n int) []coordinator.Line {
	return []coordinator.Line{{SKU: skus[0], Qty: int64(1 + n%2)}, {SKU: skus[1], Qty: 1}}
}

// helperXcart places orders of two lines over two clusters in a loop, on
// each Churn route: "SENT <order>" before, "ACK <order>" or "ERR <order>
// <error>" after.
func helperXcart(ctx context.Context, c *coordinator.Coordinator, cfg helperConfig, out *lineWriter) {
	var wg sync.WaitGroup
	for _, route := range cfg.Churn {
		wg.Go(func() {
			for n := 0; n < 100_000 && ctx.Err() == nil; n++ {
				order := fmt.Sprintf("x-%s-%d", route, n)
				out.printf("SENT %s", order)
				actx, cancel := context.WithTimeout(ctx, 5*time.Second)
				_, err := c.AllocateOrder(actx, order, xcartLines(cfg.Lines, n))
				cancel()
				if err != nil {
					out.printf("ERR %s %v", order, strings.ReplaceAll(err.Error(), "\n", " "))
					continue
				}
				out.printf("ACK %s", order)
			}
		})
	}
	wg.Wait()
}

// A process placing orders of two lines over two clusters (each reserved
// in its cluster, then committed by its decision record in the first
// cluster, then confirmed) is SIGKILLed mid-sale, with a 2 s reservation
// TTL. Invariants:
//   - once each cluster's rebalancer has swept, nothing is held as a
//     reservation: what the dead process had reserved and not committed
//     expired, what it had committed and not confirmed everywhere was
//     confirmed by the sweeps;
//   - every acknowledged order has both lines confirmed;
//   - no order is partial, before any retry: every order sent has both
//     lines held or neither (an order the kill cut in the confirms was
//     committed, so its other line was confirmed by its sweep);
//   - a retry of every order sent, by another process, leaves each whole
//     or absent;
//   - the books balance, and the feed's table equals the audits; Prune
//     then leaves no decision record.
func TestKilledMidOrderOverTwoClusters(t *testing.T) {
	first := etcdtest.NewSingle(t, etcdtest.WithNoFsync())
	second := etcdtest.NewSingle(t, etcdtest.WithNoFsync())
	c := newFleetCoord(t, first.Endpoints(), second.Endpoints())
	ctx := t.Context()
	skus := []string{"xa", "xb"}
	for i, cl := range []string{"first", "second"} {
		if _, err := c.CreateSKUIn(ctx, cl, skus[i], coordinator.SKUConfig{Total: 100_000, Segments: 2, InitialFill: 50_000}); err != nil {
			t.Fatal(err)
		}
	}
	routes := []string{"r0", "r1", "r2", "r3"}
	helper := startHelper(t, helperConfig{Mode: "xcart", Endpoints: first.Endpoints(), SecondEndpoints: second.Endpoints(),
		TTLSec: int(ttl / time.Second), Churn: routes, Lines: skus, AcrossTTLMs: 2000})
	etcdtest.WaitFor(t, "20 orders acknowledged", 60*time.Second, func() bool { return helper.count("ACK ") >= 20 })
	helper.kill(t)

	for _, cl := range c.Clusters() {
		r, err := rebalance.New(c.Cluster(cl), rebalance.Config{Identity: "reb-" + cl, SweepInterval: 100 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		rctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() {
			defer close(done)
			_ = r.Run(rctx)
		}()
		t.Cleanup(func() {
			cancel()
			<-done
		})
	}
	etcdtest.WaitFor(t, "no reservation held in either cluster", 60*time.Second, func() bool {
		for _, sku := range skus {
			r, err := c.Audit(ctx, sku)
			if err != nil || !r.OK || r.Reserved != 0 {
				return false
			}
		}
		return true
	})

	sent, acked := map[string]int{}, map[string]bool{}
	for _, l := range helper.Lines() {
		f := strings.Fields(l)
		switch {
		case len(f) >= 2 && f[0] == "SENT":
			var route string
			var n int
			if _, err := fmt.Sscanf(strings.ReplaceAll(f[1], "-", " "), "x %s %d", &route, &n); err != nil {
				t.Fatalf("helper line %q: %v", l, err)
			}
			sent[f[1]] = n
		case len(f) >= 2 && f[0] == "ACK":
			acked[f[1]] = true
		}
	}
	clients := []*clientv3.Client{first.Client(t), second.Client(t)}
	held := func() map[string]int { // order → how many of its lines are active
		n := map[string]int{}
		for k, ev := range feedLastE2E(t, clients) {
			if ev.Kind.Active() {
				n[k[1]]++
			}
		}
		return n
	}
	whole, partial := 0, []string{}
	active := held()
	for order := range sent {
		switch n := active[order]; {
		case acked[order] && n != 2:
			t.Fatalf("acknowledged order %s has %d of 2 lines held", order, n)
		case n == 1:
			partial = append(partial, order)
		case n == 2 && !acked[order]:
			whole++
		}
	}
	t.Logf("%d orders sent, %d acknowledged, %d not acknowledged but whole (committed, then confirmed by the sweeps or the dead process), "+
		"%d partial before the retries", len(sent), len(acked), whole, len(partial))
	if len(partial) > 0 {
		t.Fatalf("partial orders after the sweeps, before any retry: %v", partial)
	}
	for order, n := range sent {
		_, err := c.AllocateOrder(ctx, order, xcartLines(skus, n))
		if err != nil && !errors.Is(err, coordinator.ErrExpired) {
			t.Fatalf("retry of %s: %v", order, err)
		}
	}
	active = held()
	for order := range sent {
		if n := active[order]; n == 1 || acked[order] && n != 2 {
			t.Fatalf("order %s after the retries: %d of 2 lines held (acknowledged %v)", order, n, acked[order])
		}
	}
	table := map[string]int64{}
	for k, ev := range feedLastE2E(t, clients) {
		if ev.Kind.Active() {
			table[k[0]] += ev.Qty
		}
	}
	for _, sku := range skus {
		r, err := c.Audit(ctx, sku)
		if err != nil || !r.OK || r.Reserved != 0 || r.Allocated != table[sku] {
			t.Fatalf("%s: audit %+v (%v), the feed's table holds %d", sku, r, err, table[sku])
		}
	}
	// The decisions (in the first cluster: every order's first SKU, xa, is
	// there) go with the orders: the retries deleted the committed ones
	// they completed; Prune archives the rest with xa's records.
	for _, sku := range skus {
		if _, err := c.Prune(ctx, sku, time.Now().Add(time.Hour)); err != nil {
			t.Fatal(err)
		}
		if r, err := c.Audit(ctx, sku); err != nil || !r.OK {
			t.Fatalf("%s after the prune: %+v, %v", sku, r, err)
		}
	}
	resp, err := clients[0].Get(ctx, coordinator.DefaultPrefix+"decisions/", clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil || resp.Count != 0 {
		t.Fatalf("decision records after the prune: %v, %v", resp, err)
	}
}

// feedLastE2E reads every event of the clusters so far and returns each
// order's latest, by (SKU, order).
func feedLastE2E(t *testing.T, clients []*clientv3.Client) map[[2]string]feed.Event {
	t.Helper()
	last := map[[2]string]feed.Event{}
	for _, cli := range clients {
		f, err := feed.Open(t.Context(), cli, feed.Config{UntilOpen: true})
		if err != nil {
			t.Fatal(err)
		}
		for i := 0; ; i++ {
			if i > 100_000 {
				t.Fatal("feed did not end")
			}
			b, err := f.Next(t.Context())
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			for _, ev := range b.Events {
				last[[2]string{ev.SKU, ev.Order}] = ev
			}
		}
		f.Close()
	}
	return last
}
