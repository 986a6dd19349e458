package segments

import (
	"context"
	"fmt"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// refreshInboxes reads the inboxes of the held segments; it reports whether
// one of them can now give qty.
func (s *seller) refreshInboxes(ctx context.Context, qty int64) (bool, error) {
	var idx []int
	var ops []clientv3.Op
	for i, q := range s.qs {
		if own, _ := q.Tenure(); own != nil {
			idx = append(idx, i)
			ops = append(ops, clientv3.OpGet(s.sts[i].inKey))
		}
	}
	if len(ops) == 0 {
		return false, nil
	}
	resp, err := s.e.kv.Txn(ctx).Then(ops...).Commit()
	if err != nil {
		return false, fmt.Errorf("read inboxes: %w", err)
	}
	found := false
	for j, i := range idx {
		st := s.sts[i]
		in, inMod, err := decodeCounterKV(st.inKey, resp.Responses[j].GetResponseRange())
		if err != nil {
			return false, err
		}
		st.mu.Lock()
		if st.token != 0 {
			st.seeInboxLocked(in, inMod)
		}
		found = found || (st.token != 0 && st.availLocked() >= qty)
		st.mu.Unlock()
	}
	return found, nil
}

// pullFromPool moves stock from the pool into the inbox of a held segment
// (home if held), enough for qty and at least a refill batch, in one short
// transaction under the pool's lock (only a lock holder writes a counter),
// so that an order never holds the pool through its step. One pull runs at
// a time per seller; one that finds that another pull already brought
// enough moves nothing. It reports whether the held segments can now give
// qty.
func (s *seller) pullFromPool(ctx context.Context, qty int64, home int) (bool, error) {
	s.pullMu.Lock()
	defer s.pullMu.Unlock()
	target := -1
	for _, i := range s.order(home) {
		own, _ := s.qs[i].Tenure()
		if own == nil {
			continue
		}
		st := s.sts[i]
		st.mu.Lock()
		enough := st.token == own.Rev() && !st.stale && st.availLocked() >= qty
		st.mu.Unlock()
		if enough {
			return true, nil // another pull (or a refill) got here first
		}
		if target < 0 {
			target = i
		}
	}
	if target < 0 {
		return false, nil
	}
	note := func(moved map[int]int64) []clientv3.Op {
		rec := Pull{Segment: target, Qty: moved[target], Lease: fmt.Sprintf("%x", s.self()), At: time.Now().UTC()}
		return []clientv3.Op{clientv3.OpPut(s.e.keys.Pull(s.sku.name), EncodePull(rec))}
	}
	moved, _, err := s.e.refill(ctx, s.sku.name, map[int]int64{target: max(qty, s.sku.refillBatch)}, 0, note, nil)
	if err != nil {
		return false, err
	}
	if moved[target] == 0 {
		return false, nil
	}
	// Refill recorded the new inbox in the segment's cache.
	st, own := s.sts[target], s.qs[target]
	o, _ := own.Tenure()
	st.mu.Lock()
	defer st.mu.Unlock()
	return o != nil && st.token == o.Rev() && st.availLocked() >= qty, nil
}
