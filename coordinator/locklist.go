package coordinator

import (
	"context"
	"errors"
	"slices"
	"sync"

	"github.com/stockctl/stockctl/internal/lock"
)

// LockState is a named lock or semaphore as etcd shows it: its holders and
// its waiters, in line order. Each is one process's etcd key; the
// goroutines of a process that share a key, or queue behind it, are not
// visible outside that process.
type LockState struct {
	// Cluster names the cluster the lock lives in, over several clusters
	// ("" for one).
	Cluster   string
	Name      string
	Semaphore bool // a semaphore (its own name space), else a lock
	Limit     int  // a semaphore's limit
	Holders   []LockKeyState
	Waiters   []LockKeyState
}

// LockKeyState is one holder's or waiter's etcd key.
type LockKeyState struct {
	Kind     LockKind
	Key      string
	Lease    int64
	Revision int64 // create revision: the order of the line
}

// Locks lists every named lock and semaphore that has a holder or a waiter,
// read at one etcd revision (returned), locks first, by name. ctx bounds
// the read. Over several clusters it lists every cluster's, read at once,
// in the clusters' order, each naming its cluster; the revision is then 0
// (each cluster has its own), and a cluster that cannot be read fails the
// call, naming it.
func (c *Coordinator) Locks(ctx context.Context) ([]LockState, int64, error) {
	if c.fleet != nil {
		return c.fleet.locksAll(ctx)
	}
	ls, rev, err := lock.List(ctx, c.kv, c.keys)
	if err != nil {
		return nil, 0, err
	}
	out := make([]LockState, len(ls))
	for i, l := range ls {
		out[i] = LockState{Name: l.Name, Semaphore: l.Semaphore, Limit: l.Limit, Holders: keyStates(l.Holders), Waiters: keyStates(l.Waiters)}
	}
	return out, rev, nil
}

func keyStates(ks []lock.ListedKey) []LockKeyState {
	out := make([]LockKeyState, len(ks))
	for i, k := range ks {
		kind := map[lock.Mode]LockKind{lock.Exclusive: KindExclusive, lock.Shared: KindShared, lock.Semaphore: KindSemaphore}[k.Mode]
		out[i] = LockKeyState{Kind: kind, Key: k.Key, Lease: k.Lease, Revision: k.Revision}
	}
	return out
}

// locksAll is Locks over every cluster of a fleet.
func (f *fleet) locksAll(ctx context.Context) ([]LockState, int64, error) {
	per := make([][]LockState, len(f.members))
	errs := make([]error, len(f.members))
	var wg sync.WaitGroup
	for i, m := range f.members {
		wg.Go(func() {
			if errs[i] = f.ready(ctx, m); errs[i] != nil {
				return
			}
			ls, _, err := m.c.Locks(ctx)
			for j := range ls {
				ls[j].Cluster = m.name
			}
			per[i], errs[i] = ls, m.wrap(err)
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, 0, err
	}
	return slices.Concat(per...), 0, nil
}
