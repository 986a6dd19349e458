package coordinator

import (
	"context"
	"fmt"
	"sync"

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

type confirmer struct {
	mu      sync.Mutex
	queue   []*confirmReq
	running bool
}

// commitConfirm commits a confirmation through the confirmer. It returns
// the revision, or 0 when the record changed since it was read (nothing was
// written), or an error: ctx's end (the confirmation may still land; a
// retry tells) or etcd's.
func (c *Coordinator) commitConfirm(ctx context.Context, r *confirmReq) (int64, error) {
	r.done = make(chan struct{})
	cf := &c.stock.confirms
	cf.mu.Lock()
	cf.queue = append(cf.queue, r)
	start := !cf.running
	cf.running = true
	cf.mu.Unlock()
	if start && !c.goBackground(c.confirmLoop) {
		c.failConfirms(ErrClosed)
	}
	select {
	case <-r.done:
		return r.rev, r.err
	case <-ctx.Done():
		return 0, fmt.Errorf("%w (the confirmation was handed to a commit that may still land: confirm again to learn its outcome)", context.Cause(ctx))
	}
}

func (c *Coordinator) failConfirms(err error) {
	cf := &c.stock.confirms
	cf.mu.Lock()
	q := cf.queue
	cf.queue, cf.running = nil, false
	cf.mu.Unlock()
	for _, r := range q {
		r.err = err
		close(r.done)
	}
}

func (c *Coordinator) confirmLoop(ctx context.Context) {
	for {
		if ctx.Err() != nil {
			c.failConfirms(ErrClosed)
			return
		}
		batch := c.nextConfirms()
		if batch == nil {
			return
		}
		c.commitConfirms(ctx, batch)
	}
}

// nextConfirms takes the oldest waiting confirmations that fit one
// transaction (two writes, one compare and one read each), never two for
// one record (etcd refuses a transaction that writes a key twice: the later
// one waits for the next). nil, and the confirmer idle, when none waits.
func (c *Coordinator) nextConfirms() []*confirmReq {
	cf := &c.stock.confirms
	cf.mu.Lock()
	defer cf.mu.Unlock()
	if len(cf.queue) == 0 {
		cf.running = false
		return nil
	}
	limit := max(1, c.opts.maxTxnOps/2)
	seen := map[string]bool{}
	var batch []*confirmReq
	rest := cf.queue[:0]
	for _, r := range cf.queue {
		if len(batch) >= limit || seen[r.key] {
			rest = append(rest, r)
			continue
		}
		seen[r.key] = true
		batch = append(batch, r)
	}
	clear(cf.queue[len(rest):])
	cf.queue = rest
	return batch
}

// commitConfirms commits batch, or answers each confirmation of it.
func (c *Coordinator) commitConfirms(bg context.Context, batch []*confirmReq) {
	ctx, cancel := context.WithTimeout(bg, c.opts.commitTimeout)
	defer cancel()
	answer := func(r *confirmReq, rev int64, err error) {
		r.rev, r.err = rev, err
		close(r.done)
	}
	for len(batch) > 0 {
		cmps := make([]clientv3.Cmp, 0, len(batch))
		ops := make([]clientv3.Op, 0, 2*len(batch))
		diag := make([]clientv3.Op, 0, len(batch))
		for _, r := range batch {
			cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(r.key), "=", r.modRev))
			ops = append(ops, clientv3.OpPut(r.key, r.value), clientv3.OpDelete(r.indexKey))
			diag = append(diag, clientv3.OpGet(r.key, clientv3.WithKeysOnly()))
		}
		resp, err := c.kv.Txn(ctx).If(cmps...).Then(ops...).Else(diag...).Commit()
		if err != nil {
			for _, r := range batch {
				answer(r, 0, err)
			}
			return
		}
		if resp.Succeeded {
			for _, r := range batch {
				answer(r, resp.Header.Revision, nil)
			}
			return
		}
		// Answer those whose record changed; send the others again.
		keep := batch[:0:0]
		for i, r := range batch {
			kvs := resp.Responses[i].GetResponseRange().GetKvs()
			switch {
			case len(kvs) == 0 || kvs[0].ModRevision != r.modRev:
				answer(r, 0, nil)
			case r.attempts >= maxCommitAttempts:
				answer(r, 0, errContention)
			default:
				r.attempts++
				keep = append(keep, r)
			}
		}
		batch = keep
	}
}
