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
// at a time, on a goroutine started when the first request arrives and
// ended when none is left.
type Batcher[T any] struct {
	// Go starts the committing goroutine (the coordinator's background
	// group); false means the group is closed: queued requests are failed.
	Go func(func(ctx context.Context)) bool
	// Select takes the oldest requests that fit one transaction out of
	// queue: it returns the batch and what stays queued, in order. It runs
	// under the batcher's mutex: it must not block.
	Select func(queue []T) (batch, rest []T)
	// Commit sends batch and answers every request of it (or hands some
	// back with Submit); it runs on the committing goroutine, under ctx,
	// which ends when the group closes.
	Commit func(ctx context.Context, batch []T)
	// Fail answers a request that will never be committed (closing).
	Fail func(T)

	mu      sync.Mutex
	queue   []T
	running bool
}

// Submit queues r; the committing goroutine picks it up with the next batch.
func (b *Batcher[T]) Submit(r T) {
	b.mu.Lock()
	b.queue = append(b.queue, r)
	start := !b.running
	b.running = true
	b.mu.Unlock()
	if start && !b.Go(b.loop) {
		b.failQueued()
	}
}

func (b *Batcher[T]) loop(ctx context.Context) {
	for {
		if ctx.Err() != nil {
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

// next takes the next batch, or returns nil and marks the batcher idle
// when nothing waits.
func (b *Batcher[T]) next() []T {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.queue) == 0 {
		b.running = false
		return nil
	}
	batch, rest := b.Select(b.queue)
	// rest reuses the queue's array: clear what it no longer holds, so
	// answered requests can be collected.
	var zero T
	for i := len(rest); i < len(b.queue); i++ {
		b.queue[i] = zero
	}
	b.queue = rest
	return batch
}

// failQueued answers every queued request with Fail (the group closed).
func (b *Batcher[T]) failQueued() {
	b.mu.Lock()
	q := b.queue
	b.queue, b.running = nil, false
	b.mu.Unlock()
	for _, r := range q {
		b.Fail(r)
	}
}
