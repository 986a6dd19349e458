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
