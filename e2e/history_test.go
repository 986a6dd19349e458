package e2e

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/stockctl/stockctl/coordinator"
	"github.com/stockctl/stockctl/internal/engines"
	"github.com/stockctl/stockctl/internal/keys"
	"github.com/stockctl/stockctl/rebalance"
	"github.com/stockctl/stockctl/segments"
)

// revChange is what one etcd revision (one transaction) did to a SKU.
type revChange struct {
	rev      int64
	pool     int64          // the pool counter after the revision, if poolSet
	poolSet  bool           //
	seg, in  map[int]int64  // segment counters and inboxes written, with their new values
	orders   bool           // an order record of the SKU was written
	meta     bool           // the SKU's meta record was written
	pull     *segments.Pull // a selling process's pull record was written
	sentinel bool
}

// skuHistory reads every change etcd made to sku's counters, orders and
// meta from revision from (inclusive) to now, one entry per revision, in
// order. etcd keeps every revision (the tests never compact), so this is
// the ground truth of what was applied, whoever reported what.
func skuHistory(t testing.TB, c *coordinator.Coordinator, sku string, from int64) []*revChange {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	k := engines.Of(c).Keys
	sentinel := k.Prefix() + "e2e-history-end/" + sku
	resp, err := c.Client().Put(ctx, sentinel, "")
	if err != nil {
		t.Fatal(err)
	}
	end := resp.Header.Revision
	var out []*revChange
	byRev := map[int64]*revChange{}
	wch := c.Client().Watch(ctx, k.Prefix(), clientv3.WithPrefix(), clientv3.WithRev(from))
	for wr := range wch {
		if err := wr.Err(); err != nil {
			t.Fatalf("history watch: %v", err)
		}
		for _, ev := range wr.Events {
			rev := ev.Kv.ModRevision
			rc := byRev[rev]
			if rc == nil {
				rc = &revChange{rev: rev, seg: map[int]int64{}, in: map[int]int64{}}
				byRev[rev] = rc
				out = append(out, rc)
			}
			key := string(ev.Kv.Key)
			switch {
			case key == sentinel:
				rc.sentinel = true
			case key == k.Meta(sku):
				rc.meta = true
			case key == k.Pull(sku):
				p, err := segments.DecodePull(key, ev.Kv.Value)
				if err != nil {
					t.Fatalf("history: %v", err)
				}
				rc.pull = &p
			case strings.HasPrefix(key, k.Orders(sku)):
				rc.orders = true
			case strings.HasPrefix(key, k.SKUStock(sku)):
				sk, err := k.ParseStock(key)
				if err != nil {
					t.Fatalf("history: %v", err)
				}
				var v int64
				if len(ev.Kv.Value) > 0 {
					if v, err = segments.DecodeCounter(key, ev.Kv.Value); err != nil {
						t.Fatalf("history: %v", err)
					}
				}
				switch sk.Kind {
				case keys.KindPool:
					rc.pool, rc.poolSet = v, true
				case keys.KindSegment:
					rc.seg[sk.Index] = v
				case keys.KindInbox:
					rc.in[sk.Index] = v
				}
			}
		}
		if len(out) > 0 && out[len(out)-1].rev >= end {
			break
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].rev < out[j].rev })
	return out
}

// histMove is a move found in the history: a rebalancer's, or (pull) a
// selling process's move from the pool into a segment it held.
type histMove struct {
	rev         int64
	seg         int
	kind        rebalance.MoveKind
	qty         int64
	availBefore int64 // the segment's counter + inbox just before the move
	pull        bool
}

// movesIn replays the history of a SKU from start (its counters just
// before the history's first revision) and returns every move in it: a revision that changes the pool
// without writing an order or the meta record. It fails t on a pool change
// that is neither a move (pool and segments changing by the same amount)
// nor an order nor a restock: stock appearing or vanishing.
func movesIn(t testing.TB, start stockState, hist []*revChange) []histMove {
	t.Helper()
	pool, seg, in := start.pool, start.seg, start.in
	var moves []histMove
	for _, rc := range hist {
		if rc.poolSet && !rc.orders && !rc.meta {
			dPool := rc.pool - pool
			var dSegs int64
			for i, v := range rc.seg {
				dSegs += v - seg[i]
			}
			for i, v := range rc.in {
				dSegs += v - in[i]
			}
			if dPool+dSegs != 0 || dPool == 0 {
				t.Fatalf("revision %d: pool %+d, segments %+d: stock appeared or vanished (%+v)", rc.rev, dPool, dSegs, *rc)
			}
			touched := map[int]bool{}
			for i := range rc.seg {
				touched[i] = true
			}
			for i := range rc.in {
				touched[i] = true
			}
			for i := range touched {
				before := seg[i] + in[i]
				after := before
				if v, ok := rc.seg[i]; ok {
					after += v - seg[i]
				}
				if v, ok := rc.in[i]; ok {
					after += v - in[i]
				}
				m := histMove{rev: rc.rev, seg: i, availBefore: before, pull: rc.pull != nil}
				switch {
				case m.pull && (rc.pull.Segment != i || rc.pull.Qty != after-before || dPool != -rc.pull.Qty || len(touched) != 1):
					t.Fatalf("revision %d: pull record %+v, but segment %d went %d → %d and the pool changed by %+d", rc.rev, *rc.pull, i, before, after, dPool)
				case dPool < 0 && after > before:
					m.kind, m.qty = rebalance.Refill, after-before
				case dPool > 0 && after < before:
					m.kind, m.qty = rebalance.Drain, before-after
				default:
					t.Fatalf("revision %d: segment %d went %d → %d while the pool changed by %+d", rc.rev, i, before, after, dPool)
				}
				moves = append(moves, m)
			}
		}
		if rc.poolSet {
			pool = rc.pool
		}
		for i, v := range rc.seg {
			seg[i] = v
		}
		for i, v := range rc.in {
			in[i] = v
		}
	}
	return moves
}

// leaderAt returns the identity that led the rebalancer election at rev.
func leaderAt(t testing.TB, c *coordinator.Coordinator, rev int64) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := c.Client().Get(ctx, engines.Of(c).Keys.Election(), append(clientv3.WithFirstCreate(), clientv3.WithRev(rev))...)
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) == 0 {
		return ""
	}
	return string(resp.Kvs[0].Value)
}

func (m histMove) String() string {
	return fmt.Sprintf("%s of %d into/from segment %d at rev %d (segment had %d)", m.kind, m.qty, m.seg, m.rev, m.availBefore)
}

// stockState is a SKU's counters at one revision.
type stockState struct {
	pool    int64
	seg, in map[int]int64
}

// stockAt reads sku's counters at rev.
func stockAt(t testing.TB, c *coordinator.Coordinator, sku string, rev int64) stockState {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	k := engines.Of(c).Keys
	resp, err := c.Client().Get(ctx, k.SKUStock(sku), clientv3.WithPrefix(), clientv3.WithRev(rev))
	if err != nil {
		t.Fatal(err)
	}
	st := stockState{seg: map[int]int64{}, in: map[int]int64{}}
	for _, kv := range resp.Kvs {
		sk, err := k.ParseStock(string(kv.Key))
		if err != nil {
			t.Fatal(err)
		}
		v, err := segments.DecodeCounter(string(kv.Key), kv.Value)
		if err != nil {
			t.Fatal(err)
		}
		switch sk.Kind {
		case keys.KindPool:
			st.pool = v
		case keys.KindSegment:
			st.seg[sk.Index] = v
		case keys.KindInbox:
			st.in[sk.Index] = v
		}
	}
	return st
}
