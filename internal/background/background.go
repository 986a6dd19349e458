// Package background runs a component's goroutines so that closing the
// component can end them all and wait for them, and gives every wait in the
// module one way to sleep under a ctx.
package background

import (
	"context"
	"sync"
	"time"
)

// Group tracks goroutines started with Go. Stop ends their ctx; Wait returns
// once all of them have returned. A Group is shared by the engines of one
// coordinator, so that Close stops every goroutine of the process's
// coordinator in one step.
type Group struct {
	ctx  context.Context
	stop context.CancelFunc

	// mu orders Go's Add against Stop: no Add can follow Stop, so Wait after
	// Stop never races a late Add.
	mu sync.Mutex
	wg sync.WaitGroup
}

// NewGroup returns a running group.
func NewGroup() *Group {
	ctx, stop := context.WithCancel(context.Background())
	return &Group{ctx: ctx, stop: stop}
}

// Ctx ends when Stop is called. Work that must not be cut short by one
// caller's ctx (a group commit serving many callers, cleanup after a
// cancelled wait) runs under it, usually with a timeout of its own.
func (g *Group) Ctx() context.Context { return g.ctx }

// Go runs f in a goroutine tracked by the group, with the group's ctx. It
// reports false, running nothing, once Stop has been called.
func (g *Group) Go(f func(ctx context.Context)) bool {
	g.mu.Lock()
	if g.ctx.Err() != nil {
		g.mu.Unlock()
		return false
	}
	g.wg.Add(1)
	g.mu.Unlock()
	go func() {
		defer g.wg.Done()
		f(g.ctx)
	}()
	return true
}

// Stop ends the group's ctx; later calls to Go run nothing.
func (g *Group) Stop() {
	g.mu.Lock()
	g.stop()
	g.mu.Unlock()
}

// Wait returns once every goroutine started with Go has returned. Call it
// after Stop.
func (g *Group) Wait() { g.wg.Wait() }

// Sleep waits d, or less if ctx ends first; it reports whether the whole d
// passed.
func Sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
