package lock

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strconv"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/stockctl/stockctl/internal/keys"
)

// Listed is one named lock or semaphore as etcd shows it at one revision:
// who holds it and who waits, in line order, by the protocol's rules (a lock:
// its oldest key if exclusive, else its shared keys older than its oldest
// exclusive key; a semaphore: its limit oldest keys).
type Listed struct {
	Name      string
	Semaphore bool
	Limit     int // semaphores
	Holders   []ListedKey
	Waiters   []ListedKey
}

// ListedKey is one holder's or waiter's key. A key stands for one process's
// tenure: goroutines of that process sharing it (local handoffs, shared
// joins) or queued behind it are not visible in etcd.
type ListedKey struct {
	Mode     Mode
	Key      string
	Lease    int64
	Revision int64 // create revision: the line order
}

// List reads every named lock's and semaphore's keys under sp at one
// revision and returns them sorted by name (locks first), with that
// revision.
func List(ctx context.Context, kv clientv3.KV, sp keys.Space) ([]Listed, int64, error) {
	resp, err := kv.Txn(ctx).Then(
		clientv3.OpGet(sp.LocksPrefix(), clientv3.WithPrefix()),
		clientv3.OpGet(sp.SemaphoresPrefix(), clientv3.WithPrefix()),
	).Commit()
	if err != nil {
		return nil, 0, fmt.Errorf("list locks: %w", err)
	}
	type group struct {
		l    Listed
		keys []ListedKey
	}
	groups := map[string]*group{}
	var order []string
	for i, r := range resp.Responses {
		for _, kv := range r.GetResponseRange().Kvs {
			nk, err := sp.ParseNamed(string(kv.Key))
			if err != nil {
				continue // not a waiter key: nothing stockctl wrote
			}
			id := fmt.Sprint(i, "/", nk.Name)
			g := groups[id]
			if g == nil {
				g = &group{l: Listed{Name: nk.Name, Semaphore: i == 1}}
				groups[id] = g
				order = append(order, id)
			}
			mode := map[keys.NamedKind]Mode{keys.NamedExclusive: Exclusive, keys.NamedShared: Shared, keys.NamedSemaphore: Semaphore}[nk.Kind]
			if g.l.Semaphore && g.l.Limit == 0 {
				g.l.Limit, _ = strconv.Atoi(string(kv.Value))
			}
			g.keys = append(g.keys, ListedKey{Mode: mode, Key: string(kv.Key), Lease: nk.Lease, Revision: kv.CreateRevision})
		}
	}
	slices.Sort(order) // "0/..." (locks) before "1/..." (semaphores), by name
	out := make([]Listed, 0, len(order))
	for _, id := range order {
		g := groups[id]
		slices.SortFunc(g.keys, func(a, b ListedKey) int { return cmp.Compare(a.Revision, b.Revision) })
		for i, k := range g.keys {
			if holds(g.l, g.keys, i) {
				g.l.Holders = append(g.l.Holders, k)
			} else {
				g.l.Waiters = append(g.l.Waiters, k)
			}
		}
		out = append(out, g.l)
	}
	return out, resp.Header.Revision, nil
}

// holds reports whether the i-th key (by create revision) of l holds.
func holds(l Listed, ks []ListedKey, i int) bool {
	if l.Semaphore {
		return i < l.Limit
	}
	if ks[i].Mode == Exclusive {
		return i == 0
	}
	return !slices.ContainsFunc(ks[:i], func(k ListedKey) bool { return k.Mode == Exclusive })
}
