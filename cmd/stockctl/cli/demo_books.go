package cli

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/stockctl/stockctl/coordinator"
	"github.com/stockctl/stockctl/internal/engines"
	"github.com/stockctl/stockctl/internal/keys"
	"github.com/stockctl/stockctl/segments"
)

// The demo's figures come from the books in etcd, whoever wrote them: the
// moves from etcd's history of the SKU's counters (the elected rebalancer
// may be another process's, e.g. `stockctl serve`'s), the checkout figures
// from the order records. A figure counted by the demo's own callbacks
// would miss what others did, and depend on who was fastest.

// bookMoves are the stock moves of one SKU over a range of revisions, per
// segment: refills and pulls (pool → segment inbox; a pull is a selling
// process's, told apart by its pull record written in the same revision)
// and drains (segment → pool).
type bookMoves struct {
	refills, refilled []int64
	pulls, pulled     []int64
	drains, drained   []int64
}

// readMoves replays the history of sku's counters from revision from+1 to
// to, and classifies each revision that changed them. A revision where the
// pool fell by what segments' inboxes gained is a refill (or a pull); one
// where it rose by what segments lost is a drain. Orders, returns,
// expiries and restocks change the pool or the segments alone, or move
// units between a segment's counter and inbox: they are not moves.
func readMoves(ctx context.Context, c *coordinator.Coordinator, sku string, n int, from, to int64) (*bookMoves, error) {
	e := engines.Of(c)
	m := &bookMoves{refills: make([]int64, n), refilled: make([]int64, n), pulls: make([]int64, n), pulled: make([]int64, n),
		drains: make([]int64, n), drained: make([]int64, n)}
	if to <= from {
		return m, nil
	}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// One watch of the prefix: the counters and the pull record of a
	// revision arrive together. Other keys (orders) are skipped.
	wch := e.Client.Watch(clientv3.WithRequireLeader(wctx), e.Keys.Prefix(), clientv3.WithPrefix(),
		clientv3.WithRev(from+1), clientv3.WithPrevKV())
	rev, cur := int64(0), newRevision(n)
	flush := func() {
		if rev != 0 {
			cur.classify(m)
		}
	}
	// Progress notifications tell when the history up to `to` has all
	// arrived: the watch otherwise waits for a change that may never come.
	ticker := time.NewTicker(100 * time.Millisecond)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil, context.Cause(ctx)
		case <-ticker.C:
			_ = e.Client.RequestProgress(wctx)
			continue
		case resp, ok := <-wch:
			if !ok {
				return nil, errors.New("the watch of the sale's history ended")
			}
			if err := resp.Err(); err != nil {
				return nil, fmt.Errorf("read the sale's history: %w", err)
			}
			for _, ev := range resp.Events {
				r := ev.Kv.ModRevision
				if r > to {
					flush()
					return m, nil
				}
				if r != rev {
					flush()
					rev, cur = r, newRevision(n)
				}
				if err := cur.add(e.Keys, sku, ev); err != nil {
					return nil, err
				}
			}
			if resp.IsProgressNotify() && resp.Header.Revision >= to {
				flush()
				return m, nil
			}
		}
	}
}

// revisionDelta is what one revision changed of a SKU's counters.
type revisionDelta struct {
	pool   int64
	inbox  []int64
	seg    []int64 // counter + inbox
	pulled bool
}

func newRevision(n int) *revisionDelta {
	return &revisionDelta{inbox: make([]int64, n), seg: make([]int64, n)}
}

func (d *revisionDelta) add(space keys.Space, sku string, ev *clientv3.Event) error {
	key := string(ev.Kv.Key)
	if key == space.Pull(sku) {
		d.pulled = ev.Type == mvccpb.PUT
		return nil
	}
	if !strings.HasPrefix(key, space.SKUStock(sku)) {
		return nil
	}
	k, err := space.ParseStock(key)
	if err != nil || k.SKU != sku || k.Index >= len(d.seg) {
		return nil
	}
	var now, before int64
	if ev.Type == mvccpb.PUT {
		if now, err = segments.DecodeCounter(key, ev.Kv.Value); err != nil {
			return err
		}
	}
	if ev.PrevKv != nil {
		if before, err = segments.DecodeCounter(key, ev.PrevKv.Value); err != nil {
			return err
		}
	}
	switch delta := now - before; k.Kind {
	case keys.KindPool:
		d.pool += delta
	case keys.KindInbox:
		d.inbox[k.Index] += delta
		d.seg[k.Index] += delta
	case keys.KindSegment:
		d.seg[k.Index] += delta
	}
	return nil
}

func (d *revisionDelta) classify(m *bookMoves) {
	var gained, lost int64
	for i := range d.seg {
		gained += max(d.inbox[i], 0)
		lost += max(-d.seg[i], 0)
	}
	switch {
	case d.pool < 0 && gained == -d.pool:
		for i, q := range d.inbox {
			if q <= 0 {
				continue
			}
			if d.pulled {
				m.pulls[i]++
				m.pulled[i] += q
			} else {
				m.refills[i]++
				m.refilled[i] += q
			}
		}
	case d.pool > 0 && lost == d.pool:
		for i, q := range d.seg {
			if q < 0 {
				m.drains[i]++
				m.drained[i] -= q
			}
		}
	}
}

// checkoutBooks are the checkout demo's figures, from the order records:
// the carts left unpaid (order IDs ending in demoCartSuffix) and the
// reservations that expired, carts or orders whose payment came too late.
type checkoutBooks struct {
	carts, cartUnits, cartsExpired int64
	expired, expiredUnits          int64
	late                           int64 // orders that expired before their payment, placed again
	live                           int64 // reservations still live
}

func readCheckout(ctx context.Context, c *coordinator.Coordinator, sku string) (*checkoutBooks, error) {
	e := engines.Of(c)
	b := &checkoutBooks{}
	from, end := e.Keys.Orders(sku), clientv3.GetPrefixRangeEnd(e.Keys.Orders(sku))
	for {
		resp, err := e.KV.Get(ctx, from, clientv3.WithRange(end), clientv3.WithLimit(5000))
		if err != nil {
			return nil, err
		}
		for _, kv := range resp.Kvs {
			o, err := segments.DecodeOrder(string(kv.Key), kv.Value)
			if err != nil {
				return nil, err
			}
			if o.IsPruned() {
				continue // its units are in the archive record
			}
			cart := strings.HasSuffix(o.ID, demoCartSuffix)
			if cart {
				b.carts++
				b.cartUnits += o.Qty
			}
			switch {
			case o.State == segments.StateExpired:
				b.expired++
				b.expiredUnits += o.Qty
				if cart {
					b.cartsExpired++
				} else {
					b.late++
				}
			case o.Reserved():
				b.live++
			}
		}
		if !resp.More {
			return b, nil
		}
		from = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00"
	}
}
