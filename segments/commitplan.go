package segments

import (
	"context"
	"errors"
	"time"

	"github.com/stockctl/stockctl/internal/lock"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Per order, a transaction needs one compare (its record absent), one put
// (the record, which is its ID's claim) and one read in its Else (the
// record); per place
// two compares (the lock's key, the counter's revision), one put (the
// counter) and one read (the lock's key). Inboxes are absorbed apart
// (absorb.go).
const (
	orderCmps, orderPuts, orderGets = 1, 1, 1
)

// opCost is what one place costs a transaction: compares, puts, and reads
// in its Else branch.
type opCost struct{ cmps, puts, gets int }

// heldPlaceCost is a held place's (commit.go); a direct place costs more
// (directPlaceCost).
var heldPlaceCost = opCost{cmps: 2, puts: 1, gets: 1}

// selectOrders is the committer's batch selection (the batcher's Select):
// requests that share nothing with the commits in flight (inflight.go).
func (e *Engine) selectOrders(queue []*commitReq) (batch, rest []*commitReq) {
	return e.inflight.take(queue, e.cfg.MaxTxnOps, heldPlaceCost)
}

// selectOrders takes the oldest requests of queue that fit one transaction
// (etcd's --max-txn-ops, limit, bounds compares, puts and reads
// separately). Two requests for one order ID never share a batch (the
// transaction would put its keys twice): the later one waits for the next,
// where it finds the ID used. Requests for which busy is true stay queued.
// The first request taken always goes, whatever its size. Each distinct
// place costs place.
func selectOrders(queue []*commitReq, limit int, place opCost, busy func(*commitReq) bool) (batch, rest []*commitReq) {
	var cmps, puts, gets int
	places := map[*placeState]bool{}
	orders := map[string]bool{}
	users := map[string]bool{}
	rest = queue[:0]
	full := false
	for _, cr := range queue {
		if full || orders[cr.req.order] || (busy != nil && busy(cr)) {
			rest = append(rest, cr)
			continue
		}
		nc, np, ng := orderCmps, orderPuts, orderGets
		if cr.req.ttl > 0 {
			np++ // the reservation's index key
		}
		newUser := cr.req.userKey != "" && !users[cr.req.userKey]
		if newUser {
			nc, np, ng = nc+1, np+1, ng+1 // the buyer's counter
		}
		var fresh []*placeState
		for _, p := range cr.parts {
			if !places[p.st] {
				fresh = append(fresh, p.st)
				nc, np, ng = nc+place.cmps, np+place.puts, ng+place.gets
			}
		}
		if len(batch) > 0 && (cmps+nc > limit || puts+np > limit || gets+ng > limit) {
			full = true
			rest = append(rest, cr)
			continue
		}
		cmps, puts, gets = cmps+nc, puts+np, gets+ng
		for _, st := range fresh {
			places[st] = true
		}
		orders[cr.req.order] = true
		if newUser {
			users[cr.req.userKey] = true
		}
		batch = append(batch, cr)
	}
	return batch, rest
}

// batchPlace is one place of a batch: what the batch takes there and how.
type batchPlace struct {
	st       *placeState
	q        *lock.Queue
	own      *lock.Ownership
	take     int64
	n        int   // parts
	value    int64 // the counter after the batch
	modRev   int64 // the counter's expected ModRevision
	absorb   bool
	inMod    int64
	lost     bool
	shortage bool
	err      error // reading the place failed
}

// planBatch works out each place's new counter, in the order the places
// first appear. A place whose cache is stale is read first; one whose lock
// is gone is marked lost, one that holds less than the batch takes there
// (which reservations prevent unless etcd changed under us) short.
func (e *Engine) planBatch(ctx context.Context, batch []*commitReq) (map[*placeState]*batchPlace, []*batchPlace) {
	places := map[*placeState]*batchPlace{}
	var order []*batchPlace
	for _, cr := range batch {
		for _, p := range cr.parts {
			bp := places[p.st]
			if bp == nil {
				bp = &batchPlace{st: p.st, q: p.q, own: p.own}
				places[p.st] = bp
				order = append(order, bp)
			}
			if bp.own != p.own {
				bp.lost = true // two keys for one place: the older one is gone
			}
			bp.take += p.qty
			bp.n++
		}
	}
	for _, bp := range order {
		if bp.lost || bp.own.Err() != nil {
			bp.lost = true
			continue
		}
		if err := bp.st.ensure(ctx, e, bp.own); err != nil {
			if errors.Is(err, lock.ErrLost) {
				bp.lost = true
			} else {
				bp.err = err
			}
			continue
		}
		st := bp.st
		st.mu.Lock()
		if st.token != bp.own.Rev() {
			bp.lost = true
		}
		bp.modRev = st.modRev
		switch {
		case st.value >= bp.take:
			bp.value = st.value - bp.take
		case st.inKnown && st.value+st.inbox >= bp.take:
			bp.absorb, bp.inMod = true, st.inMod
			bp.value = st.value + st.inbox - bp.take
		default:
			bp.shortage = true
		}
		st.mu.Unlock()
	}
	return places, order
}

func countPlaces(batch []*commitReq) int {
	seen := map[*placeState]bool{}
	for _, cr := range batch {
		for _, p := range cr.parts {
			seen[p.st] = true
		}
	}
	return len(seen)
}

// touches reports whether any of r's places satisfies f.
func (r *commitReq) touches(places map[*placeState]*batchPlace, f func(*batchPlace) bool) bool {
	for _, p := range r.parts {
		if bp := places[p.st]; bp != nil && f(bp) {
			return true
		}
	}
	return false
}

// placeErr is the first read error among r's places.
func (r *commitReq) placeErr(places map[*placeState]*batchPlace) error {
	for _, p := range r.parts {
		if bp := places[p.st]; bp != nil && bp.err != nil {
			return bp.err
		}
	}
	return nil
}

// segmentParts is where the order's stock comes from, as recorded.
func (r *commitReq) segmentParts() []Part {
	parts := make([]Part, 0, len(r.parts))
	for _, p := range r.parts {
		parts = append(parts, Part{Place: p.st.place, Qty: p.qty})
	}
	return parts
}

// sendOrders sends a group commit whose places' compares, puts and Else
// reads are in cmps, ops and diag, with what every batch of orders carries
// after them: each order's absence compare, record puts and ID read, then
// the buyers' counters last (diagnose expects the Else reads in that
// order). partsOf are each order's parts, as recorded. Held and direct
// commits both send through it.
func (e *Engine) sendOrders(ctx context.Context, batch []*commitReq, users []*batchUser, cmps []clientv3.Cmp, ops, diag []clientv3.Op) (resp *clientv3.TxnResponse, partsOf [][]Part, err error) {
	partsOf = make([][]Part, len(batch))
	for i, cr := range batch {
		partsOf[i] = cr.segmentParts()
		cmps = append(cmps, e.orderAbsent(cr.req.sku.name, cr.req.order))
		ops = append(ops, e.orderPuts(cr.req, partsOf[i])...)
		diag = append(diag, clientv3.OpGet(e.orderKey(cr.req)))
	}
	ucmps, uops, udiag := userCmpsOps(users)
	cmps, ops, diag = append(cmps, ucmps...), append(ops, uops...), append(diag, udiag...)
	sent := time.Now()
	resp, err = e.kv.Txn(ctx).If(cmps...).Then(ops...).Else(diag...).Commit()
	e.metrics.committed(len(batch), time.Since(sent), commitOutcome(resp, err))
	return resp, partsOf, err
}
