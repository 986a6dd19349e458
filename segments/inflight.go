package segments

import "sync"

// Group commits in flight. A place's next commit is planned on its
// previous one's outcome (the counter as committed), so a place is in one
// transaction in flight at a time. Transactions whose places, buyers and
// order IDs are disjoint can be in flight together, and are when one
// would not hold what waits, or is small (the batcher's SpillOnly,
// inflight.spills): a second transaction beside the first halves both,
// and on a machine the load saturates each round costs etcd and the
// client alike (a raft entry, a WAL write, a gRPC call), so under load a
// commit takes everything that waits, and a second goes only when the
// first is full; at a light load, commits of a few orders go side by
// side. On one hot SKU the batches share their places and go one after
// another.

// commitParallel is how many group commits a process may have in flight.
const commitParallel = 2

// inflight is what the group commits in flight hold.
type inflight struct {
	mu     sync.Mutex
	places map[*placeState]int
	users  map[string]int
	orders map[string]int
	spill  bool // a commit may go beside the last batch taken (spills)
}

// take is a batcher's Select over f: the oldest requests of queue that fit
// one transaction (limit operations, place for each distinct place) and
// share nothing with the commits in flight, marked in flight.
func (f *inflight) take(queue []*commitReq, limit int, place opCost) (batch, rest []*commitReq) {
	f.mu.Lock()
	defer f.mu.Unlock()
	batch, rest, full := selectOrders(queue, limit, place, f.conflictsLocked)
	f.spill = full || len(batch) < spillBelow
	f.markLocked(batch, 1)
	return batch, rest
}

// spillBelow is the batch under which a commit may go beside it (the
// batcher's SpillOnly): under load commits are larger, and one waits for
// the other so that both are full; at a light load a batch of a few
// orders gains little from what would arrive while it is in flight, and
// two buyers of a process ordering one at a time would otherwise take
// turns (docs/benchmarks.md, stop 49).
const spillBelow = 8

// spills reports whether a commit may go beside the last batch take took
// (the batcher's Spill): the batch was full (requests were left that did
// not fit it), or smaller than spillBelow.
func (f *inflight) spills() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.spill
}

// conflicts reports whether cr shares a place, a buyer or its order ID with
// a commit in flight. The caller holds f.mu.
func (f *inflight) conflictsLocked(cr *commitReq) bool {
	if f.orders[cr.req.order] > 0 || (cr.req.userKey != "" && f.users[cr.req.userKey] > 0) {
		return true
	}
	for _, p := range cr.parts {
		if f.places[p.st] > 0 {
			return true
		}
	}
	return false
}

// mark and unmark add a batch to what is in flight, and take it off.
func (f *inflight) markLocked(batch []*commitReq, d int) {
	if f.places == nil {
		f.places, f.users, f.orders = map[*placeState]int{}, map[string]int{}, map[string]int{}
	}
	for _, cr := range batch {
		f.orders[cr.req.order] += d
		if f.orders[cr.req.order] == 0 {
			delete(f.orders, cr.req.order)
		}
		if k := cr.req.userKey; k != "" {
			if f.users[k] += d; f.users[k] == 0 {
				delete(f.users, k)
			}
		}
		for _, p := range cr.parts {
			if f.places[p.st] += d; f.places[p.st] == 0 {
				delete(f.places, p.st)
			}
		}
	}
}

func (f *inflight) unmark(batch []*commitReq) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.markLocked(batch, -1)
}
