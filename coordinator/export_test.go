package coordinator

import "fmt"

// LocalWaiters is the number of this process's goroutines queued for the
// named lock (tests observe queueing with it instead of sleeping).
func (c *Coordinator) LocalWaiters(name string) int {
	c.mu.Lock()
	q := c.queues[c.keys.Lock(name)]
	c.mu.Unlock()
	if q == nil {
		return 0
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.waiters.Len()
}

// DebugQueue describes this process's queue of a segment lock (tests).
func (c *Coordinator) DebugQueue(sku string, seg int) string {
	c.mu.Lock()
	q := c.queues[c.keys.SegmentLock(sku, seg)]
	c.mu.Unlock()
	if q == nil {
		return "no queue"
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	s := fmt.Sprintf("retain=%v busy=%v holder=%v waiters=%d", q.retain, q.busy, q.holder != nil, q.waiters.Len())
	if q.own != nil {
		s += fmt.Sprintf(" own=%s@%d yielding=%v pins=%d err=%v", q.own.key, q.own.rev, q.own.yielding, q.own.pins, q.own.ctx.Err())
	}
	return s
}

// DebugSeller describes the seller of sku (tests).
func (c *Coordinator) DebugSeller(sku string) string {
	c.stock.mu.Lock()
	s := c.stock.sellers[sku]
	c.stock.mu.Unlock()
	if s == nil {
		return "no seller"
	}
	out := ""
	for i := range s.qs {
		st := s.sts[i]
		st.mu.Lock()
		out += fmt.Sprintf("\nseg %d: %s | token %d value %d inbox %d/%v reserved %d pending %d stale %v", i, c.DebugQueue(sku, i), st.token, st.value, st.inbox, st.inKnown, st.reserved, st.pending, st.stale)
		st.mu.Unlock()
	}
	s.mu.Lock()
	out += fmt.Sprintf("\nwaiters %d claiming %v view %v self %x", s.waiters.Len(), s.claiming, s.view, s.self())
	s.mu.Unlock()
	return out
}
