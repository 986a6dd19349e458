// Package batch is the group commit shared by the stock engine's writers:
// callers hand it requests, and one goroutine at a time sends everything
// that waits in as few etcd transactions as fit, so that under load a
// request costs a fraction of one etcd write.
package batch

import (
	"context"
	"sync"
)

// Batcher queues requests of type T and commits them in batches, one batch
// at a time (or Parallel at a time), on goroutines started when requests
// arrive and ended when none is left.
type Batcher[T any] struct {
	// Parallel is how many batches may be in flight at once; 0 means 1.
	// A writer whose next batch is planned on the previous one's outcome
	// keeps one, or lets Select keep its batches apart (the order
	// committers); readers may overlap.
	Parallel int
	// SpillOnly, with Parallel > 1, starts a batch beside those in flight
	// only when Spill allowed it after the last batch selected, and a
	// goroutine whose batch is answered while another is in flight ends
	// its turn unless Spill allowed it. Otherwise what arrives while a
	// batch is in flight waits for the next one, which takes it all. On
	// a machine the load saturates, a second batch beside the first
	// halves both, and each costs a round of its own (docs/benchmarks.md,
	// stop 49).
	SpillOnly bool
	// Spill reports whether a batch may go beside the one Select just
	// took (say, it was full: requests were left that it could not
	// hold). Required with SpillOnly; called under the batcher's mutex
	// right after Select.
	Spill func() bool
	// Go starts the committing goroutine (the coordinator's background
	// group); false means the group is closed: queued requests are failed.
	Go func(func(ctx context.Context)) bool
	// Select takes the oldest requests that fit one transaction out of
	// queue: it returns the batch and what stays queued, in order. It runs
	// under the batcher's mutex: it must not block. With Parallel > 1 it
	// may take none (what waits conflicts with batches in flight); it must
	// take some when no batch is in flight.
	Select func(queue []T) (batch, rest []T)
	// Commit sends batch and answers every request of it (or hands some
	// back with Submit); it runs on the committing goroutine, under ctx,
	// which ends when the group closes.
	Commit func(ctx context.Context, batch []T)
	// Fail answers a request that will never be committed (closing).
	Fail func(T)

	mu      sync.Mutex
	queue   []T
	running int  // committing goroutines
	spilled bool // Spill allowed a batch beside the last one selected (SpillOnly)
}

// Submit queues r; the committing goroutine picks it up with the next batch.
func (b *Batcher[T]) Submit(r T) {
	b.mu.Lock()
	b.queue = append(b.queue, r)
	start := b.running == 0 || (b.running < b.Parallel && (!b.SpillOnly || b.spilled))
	if start {
		b.running++
	}
	b.mu.Unlock()
	if start && !b.Go(b.loop) {
		b.leave()
		b.failQueued()
	}
}

func (b *Batcher[T]) loop(ctx context.Context) {
	for {
		if ctx.Err() != nil {
			b.leave()
			b.failQueued()
			return
		}
		batch := b.next()
		if batch == nil {
			return
		}
		b.Commit(ctx, batch)
	}
}

// next takes the next batch, or returns nil and ends the calling
// goroutine's turn when nothing waits, or nothing that waits can go now
// (Select took none: what waits is for a batch in flight, whose goroutine
// takes it next), or, with SpillOnly, another goroutine is committing and
// Spill did not allow a batch beside the last one selected.
func (b *Batcher[T]) next() []T {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.queue) == 0 || (b.SpillOnly && b.running > 1 && !b.spilled) {
		// Nothing waits; or another goroutine is committing and no
		// batch may go beside it: it takes what waits when it is done.
		b.running--
		return nil
	}
	batch, rest := b.Select(b.queue)
	b.spilled = b.SpillOnly && len(batch) > 0 && b.Spill()
	if len(batch) == 0 {
		b.running--
		return nil
	}
	// rest reuses the queue's array: clear what it no longer holds, so
	// answered requests can be collected.
	var zero T
	for i := len(rest); i < len(b.queue); i++ {
		b.queue[i] = zero
	}
	b.queue = rest
	return batch
}

// leave ends a committing goroutine's turn.
func (b *Batcher[T]) leave() {
	b.mu.Lock()
	b.running--
	b.mu.Unlock()
}

// failQueued answers every queued request with Fail (the group closed).
func (b *Batcher[T]) failQueued() {
	b.mu.Lock()
	q := b.queue
	b.queue = nil
	b.mu.Unlock()
	for _, r := range q {
		b.Fail(r)
	}
}
