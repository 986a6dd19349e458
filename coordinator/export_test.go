package coordinator

// Test hooks: they read the engines' state instead of sleeping.

// LocalWaiters is the number of this process's goroutines queued for the
// named lock.
func (c *Coordinator) LocalWaiters(name string) int {
	return c.locks.LocalWaiters(c.keys.Lock(name))
}

// DebugQueue describes this process's queue of a segment lock.
func (c *Coordinator) DebugQueue(sku string, seg int) string {
	return c.locks.Describe(c.keys.SegmentLock(sku, seg))
}

// DebugSeller describes the seller of sku.
func (c *Coordinator) DebugSeller(sku string) string {
	return c.stock.DescribeSeller(sku)
}

// SharedJoinable reports whether an RLock of name in this process would
// join its open shared key.
func (c *Coordinator) SharedJoinable(name string) bool {
	return c.locks.SharedJoinable(c.keys.Lock(name))
}

// LocalPermitWaiters is the number of this process's goroutines queued
// locally for a permit of the named semaphore.
func (c *Coordinator) LocalPermitWaiters(name string) int {
	return c.locks.LocalWaiters(c.keys.Semaphore(name))
}
