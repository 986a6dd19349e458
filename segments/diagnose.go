package segments

import (
	"context"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/stockctl/stockctl/internal/lock"
)

// diagnose reads a failed batch's Else branch: it answers the requests
// whose place's lock is gone or whose order ID was used, refreshes the
// caches, and returns the requests to send again.
func (e *Engine) diagnose(ctx context.Context, batch []*commitReq, order []*batchPlace, rs []*pb.ResponseOp) []*commitReq {
	i := 0
	next := func() []*mvccpb.KeyValue { r := rs[i]; i++; return r.GetResponseRange().GetKvs() }
	lost := map[*placeState]bool{}
	for _, bp := range order {
		lockKV, counterKV := next(), next()
		var inKV []*mvccpb.KeyValue
		if bp.st.inKey != "" {
			inKV = next()
		}
		if len(lockKV) == 0 || lockKV[0].CreateRevision != bp.own.Rev() {
			lost[bp.st] = true
			bp.q.Lose(bp.own, lock.ErrLost)
			continue
		}
		st := bp.st
		value, mod, err := decodeCounterKV(st.key, &pb.RangeResponse{Kvs: counterKV})
		in, inMod, inErr := int64(0), int64(0), error(nil)
		if st.inKey != "" {
			in, inMod, inErr = decodeCounterKV(st.inKey, &pb.RangeResponse{Kvs: inKV})
		}
		st.mu.Lock()
		if st.token == bp.own.Rev() {
			if err != nil || inErr != nil {
				st.stale = true
			} else {
				st.value, st.modRev = value, mod
				if st.inKey != "" {
					st.seeInboxLocked(in, inMod)
				}
			}
		}
		st.mu.Unlock()
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
	return rest
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
