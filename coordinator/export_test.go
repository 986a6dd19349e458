package coordinator

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
