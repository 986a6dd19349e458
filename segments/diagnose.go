package segments

import (
	"context"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/stockctl/stockctl/internal/lock"
)

// diagnose reads a failed batch's Else branch (each place's lock key, then
// each order's ID): it answers the requests whose place's lock is gone
// (ErrLost, nothing deducted) or whose order ID was used (a replay), and
// returns the requests to send again and the places still held, whose
// counters and inboxes the caller reads again (a refused batch may have
// planned on a cache that moved).
func (e *Engine) diagnose(ctx context.Context, batch []*commitReq, order []*batchPlace, rs []*pb.ResponseOp) (again []*commitReq, held []*batchPlace) {
	i := 0
	next := func() []*mvccpb.KeyValue { r := rs[i]; i++; return r.GetResponseRange().GetKvs() }
	lost := map[*placeState]bool{}
	for _, bp := range order {
		if lockKV := next(); len(lockKV) == 0 || lockKV[0].CreateRevision != bp.own.Rev() {
			lost[bp.st] = true
			bp.q.Lose(bp.own, lock.ErrLost)
			continue
		}
		held = append(held, bp)
	}
	rest := batch[:0:0]
	for _, cr := range batch {
		idx := next()
		switch {
		case len(idx) > 0:
			cr.finish(result(e.replay(ctx, cr.req, idx[0])))
		default:
			isLost := false
			for _, p := range cr.parts {
				isLost = isLost || lost[p.st]
			}
			if isLost {
				cr.finish(failed(lock.ErrLost))
			} else {
				rest = append(rest, cr)
			}
		}
	}
	return rest, held
}

// commitOutcome labels a group commit's round trip for the metrics.
func commitOutcome(resp *clientv3.TxnResponse, err error) string {
	switch {
	case err != nil:
		return "error"
	case resp.Succeeded:
		return "committed"
	}
	return "refused"
}
