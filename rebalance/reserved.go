package rebalance

import (
	"context"
	"sync"

	"github.com/stockctl/stockctl/internal/etcdwatch"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
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
	etcdwatch.Follow(ctx, r.c.kv, r.c.client, k.ReservationsPrefix(), func(resp *clientv3.GetResponse) {
		s.mu.Lock()
		defer s.mu.Unlock()
		s.counts = map[string]int{}
		for _, kv := range resp.Kvs {
			if sku, err := k.ReservationSKU(string(kv.Key)); err == nil {
				s.counts[sku]++
			}
		}
		s.ready = true
	}, func(evs []*clientv3.Event) {
		s.mu.Lock()
		defer s.mu.Unlock()
		for _, ev := range evs {
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
	}, func() {
		s.mu.Lock()
		s.ready = false
		s.mu.Unlock()
	})
}
