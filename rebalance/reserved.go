package rebalance

import (
	"context"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/stockctl/stockctl/internal/background"
)

// reserved knows which SKUs have live reservations, from a watch of every
// SKU's reservation index keys, so that the expiry sweep reads only those:
// in a sale of thousands of SKUs most have none, and reading two keys of
// each every poll would make the leader's cost grow with all SKUs rather
// than with those that have something to expire.
type reserved struct {
	mu     sync.Mutex
	ready  bool
	counts map[string]int // SKU → live index keys
}

// skus lists the SKUs with live reservations, and whether the count is
// known yet (before the first read, every SKU must be swept).
func (s *reserved) skus() ([]string, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.ready {
		return nil, false
	}
	out := make([]string, 0, len(s.counts))
	for sku := range s.counts {
		out = append(out, sku)
	}
	return out, true
}

// follow keeps the counts until ctx ends: a read of every index key, then a
// watch from the revision after it; again when the watch breaks.
func (r *Rebalancer) follow(ctx context.Context, s *reserved) {
	k := r.c.keys
	pfx := k.ReservationsPrefix()
	for ctx.Err() == nil {
		resp, err := r.c.kv.Get(ctx, pfx, clientv3.WithPrefix(), clientv3.WithKeysOnly())
		if err != nil {
			if !background.Sleep(ctx, 100*time.Millisecond) {
				return
			}
			continue
		}
		s.mu.Lock()
		s.counts = map[string]int{}
		for _, kv := range resp.Kvs {
			if sku, err := k.ReservationSKU(string(kv.Key)); err == nil {
				s.counts[sku]++
			}
		}
		s.ready = true
		s.mu.Unlock()
		wctx, cancel := context.WithCancel(ctx)
		for wr := range r.c.client.Watch(wctx, pfx, clientv3.WithPrefix(), clientv3.WithKeysOnly(), clientv3.WithRev(resp.Header.Revision+1)) {
			if wr.Err() != nil || wr.CompactRevision != 0 {
				break
			}
			s.mu.Lock()
			for _, ev := range wr.Events {
				sku, err := k.ReservationSKU(string(ev.Kv.Key))
				switch {
				case err != nil:
				case ev.Type == mvccpb.DELETE:
					if s.counts[sku]--; s.counts[sku] <= 0 {
						delete(s.counts, sku)
					}
				case ev.IsCreate():
					s.counts[sku]++
				}
			}
			s.mu.Unlock()
		}
		cancel()
		s.mu.Lock()
		s.ready = false
		s.mu.Unlock()
	}
}
