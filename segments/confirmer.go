package segments

import (
	"context"
	"fmt"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// The confirmer commits Confirms together, as the committer does orders:
// every confirmation waiting at that moment goes in one transaction, each
// with its own compare (the reservation's record is at the revision its
// Confirm read). A Confirm otherwise costs a fenced etcd write of its own,
// and in a checkout flow there is one per order. When the transaction fails,
// its Else reads every record: the confirmations whose record changed (an
// expiry or a cancel won the race) are answered "changed" and their Confirm
// reads again; the others are sent again in the next transaction.

// confirmReq is one confirmation handed to the confirmer.
type confirmReq struct {
	key      string // the order record
	modRev   int64  // its revision as read
	value    string // the record, confirmed
	indexKey string // the reservation's index key, deleted
	attempts int
	done     chan struct{}
	rev      int64 // the commit's revision; 0 when changed or failed
	err      error
}

// answer resolves a confirmation: rev, or 0 when its record changed or the
// commit failed with err.
func (r *confirmReq) answer(rev int64, err error) {
	r.rev, r.err = rev, err
	close(r.done)
}

// commitConfirm commits a confirmation through the confirmer. It returns
// the revision, or 0 when the record changed since it was read (nothing was
// written), or an error: ctx's end (the confirmation may still land; a
// retry tells) or etcd's.
func (e *Engine) commitConfirm(ctx context.Context, r *confirmReq) (int64, error) {
	r.done = make(chan struct{})
	e.confirms.Submit(r)
	select {
	case <-r.done:
		return r.rev, r.err
	case <-ctx.Done():
		return 0, fmt.Errorf("%w (the confirmation was handed to a commit that may still land: confirm again to learn its outcome)", context.Cause(ctx))
	}
}

// selectConfirms takes the oldest waiting confirmations that fit one
// transaction (two writes, one compare and one read each), never two for
// one record (etcd refuses a transaction that writes a key twice: the later
// one waits for the next). It is the confirmer's Select.
func (e *Engine) selectConfirms(queue []*confirmReq) (batch, rest []*confirmReq) {
	limit := max(1, e.cfg.MaxTxnOps/2)
	seen := map[string]bool{}
	rest = queue[:0]
	for _, r := range queue {
		if len(batch) >= limit || seen[r.key] {
			rest = append(rest, r)
			continue
		}
		seen[r.key] = true
		batch = append(batch, r)
	}
	return batch, rest
}

// commitConfirms commits batch, or answers each confirmation of it.
func (e *Engine) commitConfirms(bg context.Context, batch []*confirmReq) {
	ctx, cancel := context.WithTimeout(bg, e.cfg.CommitTimeout)
	defer cancel()
	for len(batch) > 0 {
		cmps := make([]clientv3.Cmp, 0, len(batch))
		ops := make([]clientv3.Op, 0, 2*len(batch))
		diag := make([]clientv3.Op, 0, len(batch))
		for _, r := range batch {
			cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(r.key), "=", r.modRev))
			ops = append(ops, clientv3.OpPut(r.key, r.value), clientv3.OpDelete(r.indexKey))
			diag = append(diag, clientv3.OpGet(r.key, clientv3.WithKeysOnly()))
		}
		resp, err := e.kv.Txn(ctx).If(cmps...).Then(ops...).Else(diag...).Commit()
		if err != nil {
			for _, r := range batch {
				r.answer(0, err)
			}
			return
		}
		if resp.Succeeded {
			for _, r := range batch {
				r.answer(resp.Header.Revision, nil)
			}
			return
		}
		// Answer those whose record changed; send the others again.
		keep := batch[:0:0]
		for i, r := range batch {
			kvs := resp.Responses[i].GetResponseRange().GetKvs()
			switch {
			case len(kvs) == 0 || kvs[0].ModRevision != r.modRev:
				r.answer(0, nil)
			case r.attempts >= maxCommitAttempts:
				r.answer(0, errContention)
			default:
				r.attempts++
				keep = append(keep, r)
			}
		}
		batch = keep
	}
}
