package service

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/stockctl/stockctl/coordinator"
)

// gates let one caller of this server at a time into the coordinator's
// named lock of each name.
//
// Why: the coordinator queues the goroutines of one process locally and
// hands a lock from one to the next without releasing its etcd key (a
// cohort handoff), so both holders see the same fencing token. Inside one
// process that is harmless; between two remote callers it is not: a caller
// that lost its hold (its stream dropped) could still write with the token
// its successor now uses. Behind the gate there is never a local waiter, so
// every Unlock deletes the key and every new hold puts a new one, with a
// larger create revision: a larger token.
//
// Waiters of one name are served in arrival order (blocked channel sends
// are FIFO), then queue in etcd with other processes' waiters as usual.
type gates struct {
	mu sync.Mutex
	m  map[string]*gate
}

type gate struct {
	slot chan struct{} // holds a value while a caller is inside
	refs int           // callers inside or waiting; guarded by gates.mu
}

func newGates() *gates { return &gates{m: map[string]*gate{}} }

// enter waits for name's gate. budget < 0 waits as long as ctx allows;
// budget >= 0 gives up after it with coordinator.ErrLocked (0: one try).
// On success the caller must call leave once, after its Unlock.
func (g *gates) enter(ctx context.Context, name string, budget time.Duration) (leave func(), err error) {
	g.mu.Lock()
	gt := g.m[name]
	if gt == nil {
		gt = &gate{slot: make(chan struct{}, 1)}
		g.m[name] = gt
	}
	gt.refs++
	g.mu.Unlock()
	leave = func() {
		<-gt.slot
		g.drop(name, gt)
	}

	select {
	case gt.slot <- struct{}{}:
		return leave, nil
	default:
	}
	var timeout <-chan time.Time
	if budget >= 0 {
		if budget == 0 {
			g.drop(name, gt)
			return nil, fmt.Errorf("lock %q: %w (by another caller of this server)", name, coordinator.ErrLocked)
		}
		t := time.NewTimer(budget)
		defer t.Stop()
		timeout = t.C
	}
	select {
	case gt.slot <- struct{}{}:
		return leave, nil
	case <-ctx.Done():
		g.drop(name, gt)
		return nil, fmt.Errorf("lock %q: %w", name, context.Cause(ctx))
	case <-timeout:
		g.drop(name, gt)
		return nil, fmt.Errorf("lock %q: %w (by another caller of this server)", name, coordinator.ErrLocked)
	}
}

func (g *gates) drop(name string, gt *gate) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if gt.refs--; gt.refs == 0 && g.m[name] == gt {
		delete(g.m, name)
	}
}
