package coordinator

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/stockctl/stockctl/segments"
)

// The commit decision of an order over several clusters (orders_fleet.go).
// After every cluster's lines are reserved, and before any is confirmed,
// the coordinator writes the order's decision "committed" in one cluster,
// D: the cluster of the order's first SKU by name (Across[0], call it s),
// at keys.Decision(s, id), beside s's record of the order. Every cluster's
// expiry then follows it (segments/across.go): before expiring the due
// lines of such an order, a sweep reads the decision: committed, it
// confirms the lines; aborted, it expires them; absent, it writes
// "aborted" and expires them.
//
// Both writes are create-if-absent, so at most one decision ever exists for
// an order: a commit and an abort racing never both win. Both also compare
// s's record as read, reserved: a decision is only ever written while that
// record is reserved, so once it is not (confirmed, expired, cancelled,
// released, pruned) the record itself stands for the decision:
//
//   - s's record confirmed: committed (it is confirmed only under a
//     committed decision); that is why the coordinator may delete the
//     decision once every cluster's lines are confirmed;
//   - s's record expired, cancelled, released or gone, and no decision:
//     aborted, and no commit can follow (it compares the record reserved).
//
// So a decision record lives while the order is in flight: deleted by the
// coordinator once every line is confirmed, otherwise (an abort, a
// coordinator that died after committing) with s's record, when Prune or
// DeleteSKU archives it, which they do only once no line of the order in
// another cluster still waits for it (Decider.Settled).

const (
	decisionCommitted = "committed"
	decisionAborted   = "aborted"
)

// decisionTimeout bounds a sweep's read or write of a decision in another
// cluster: a cluster cut off must not stall the sweep of this one (the
// lines stay held, and are tried again at the next pass).
const decisionTimeout = 5 * time.Second

// maxDecisionAttempts bounds the reads and writes of a decision whose
// compare failed (s's record changed meanwhile: read again).
const maxDecisionAttempts = 8

// errAborted is the error of a commit that found the decision aborted, or
// s's record no longer reserved: the order can no longer be whole.
var errAborted = errors.New("its commit decision is aborted")

// decisionState is what a read of a decision finds.
type decisionState struct {
	value  string          // "", decisionCommitted or decisionAborted
	rec    *segments.Order // s's record of the order (nil: none)
	recRev int64           // its mod revision
}

// decisionAt returns the member holding the decision of an order whose
// SKUs are across (sorted), and the SKU it is kept under.
func (f *fleet) decisionAt(ctx context.Context, across []string) (*member, string, error) {
	if len(across) == 0 {
		return nil, "", fmt.Errorf("%w: an order over several clusters without its SKUs", ErrCorrupt)
	}
	sku := slices.Min(across)
	m, _, err := f.route(ctx, sku)
	if err != nil {
		return nil, "", err
	}
	if err := m.connected(ctx); err != nil {
		return nil, "", err
	}
	return m, sku, nil
}

// readDecision reads the decision of order id kept under sku in m, and
// sku's record of the order, at one revision.
func (m *member) readDecision(ctx context.Context, sku, id string) (decisionState, error) {
	dk, rk := m.c.keys.Decision(sku, id), m.c.keys.Order(sku, id)
	resp, err := m.c.kv.Txn(ctx).Then(clientv3.OpGet(dk), clientv3.OpGet(rk)).Commit()
	if err != nil {
		return decisionState{}, m.wrap(err)
	}
	var st decisionState
	if kvs := resp.Responses[0].GetResponseRange().Kvs; len(kvs) > 0 {
		st.value = string(kvs[0].Value)
		if st.value != decisionCommitted && st.value != decisionAborted {
			return decisionState{}, m.wrap(&segments.CorruptError{Key: dk, Value: kvs[0].Value, Err: errors.New("not a commit decision")})
		}
	}
	if kvs := resp.Responses[1].GetResponseRange().Kvs; len(kvs) > 0 {
		o, err := segments.DecodeOrder(rk, kvs[0].Value)
		if err != nil {
			return decisionState{}, m.wrap(err)
		}
		st.rec, st.recRev = &o, kvs[0].ModRevision
	}
	return st, nil
}

// putDecision writes value as the decision of order id under sku in m if
// there is none and sku's record is still at recRev; false when a compare
// failed (read again).
func (m *member) putDecision(ctx context.Context, sku, id string, recRev int64, value string) (bool, error) {
	dk, rk := m.c.keys.Decision(sku, id), m.c.keys.Order(sku, id)
	resp, err := m.c.kv.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(dk), "=", 0), clientv3.Compare(clientv3.ModRevision(rk), "=", recRev)).
		Then(clientv3.OpPut(dk, value)).Commit()
	if err != nil {
		return false, m.wrap(err)
	}
	return resp.Succeeded, nil
}

// commitDecision decides to commit order id over the SKUs across: it
// returns nil when the decision is (or was, its record since deleted)
// committed, with written true when a decision record now exists; an error
// matching errAborted (and ErrExpired, or ErrConflict) when the order was
// aborted or its lines at the decision's SKU are no longer reserved: it can
// no longer be whole.
func (f *fleet) commitDecision(ctx context.Context, id string, across []string) (written bool, err error) {
	return f.decide(ctx, id, across, decisionCommitted, true, func(m *member, sku string, st decisionState) (bool, bool, error) {
		switch {
		case st.value == decisionCommitted:
			return true, true, nil
		case st.rec == nil:
			return true, false, m.wrap(fmt.Errorf("%w: the order has no record at %s, where its commit decision is kept", ErrOrderNotFound, sku))
		case st.rec.IsPruned():
			return true, false, m.wrap(&segments.OrderPrunedError{SKU: sku, Order: id, Pruned: st.rec.PrunedAt})
		case st.rec.State == segments.StateExpired:
			return true, false, m.wrap(fmt.Errorf("%w: %w", errAborted, &ExpiredError{SKU: sku, Order: id, Deadline: st.rec.Deadline, Revision: st.recRev}))
		case st.rec.Released:
			return true, false, m.wrap(fmt.Errorf("%w: %w: its lines at %s were cancelled or released", errAborted, ErrConflict, sku))
		case st.value == decisionAborted:
			// s's line still reserved: another cluster's sweep expired its
			// lines first (s's own sweep will follow).
			return true, false, m.wrap(fmt.Errorf("%w (a cluster's expiry sweep gave its lines back first): %w", errAborted,
				&ExpiredError{SKU: sku, Order: id, Deadline: st.rec.Deadline}))
		case st.rec.State == segments.StateConfirmed:
			return true, false, nil // committed, and its decision since deleted
		case st.rec.State != segments.StateReserved:
			return true, false, m.wrap(fmt.Errorf("%w: its lines at %s are a plain allocation, not a reservation", ErrConflict, sku))
		}
		return false, false, nil
	})
}

// abortDecision makes sure order id over the SKUs across is not committed
// unless it already is: committed true when it is (or was); otherwise the
// decision is aborted, written if s's record is still reserved (nothing can
// commit once it is not).
func (f *fleet) abortDecision(ctx context.Context, id string, across []string) (committed bool, err error) {
	return f.decide(ctx, id, across, decisionAborted, false, func(_ *member, _ string, st decisionState) (bool, bool, error) {
		switch {
		case st.value == decisionCommitted:
			return true, true, nil
		case st.value == decisionAborted:
			return true, false, nil
		case st.rec == nil || !st.rec.Active():
			return true, false, nil
		case st.rec.State == segments.StateConfirmed:
			return true, true, nil
		case st.rec.State != segments.StateReserved:
			return true, false, nil
		}
		return false, false, nil
	})
}

// decide is the loop commitDecision and abortDecision share, at order
// id's decision SKU: read the decision and s's record; judge them (done:
// the answer is known, res and err); else write value, on condition that
// no decision exists and the record is unchanged, and answer written once
// it is; a record that keeps changing gives up after maxDecisionAttempts.
func (f *fleet) decide(ctx context.Context, id string, across []string, value string, written bool,
	judge func(m *member, sku string, st decisionState) (done, res bool, err error)) (bool, error) {
	m, sku, err := f.decisionAt(ctx, across)
	if err != nil {
		return false, err
	}
	for range maxDecisionAttempts {
		st, err := m.readDecision(ctx, sku, id)
		if err != nil {
			return false, err
		}
		if done, res, err := judge(m, sku, st); done {
			return res, err
		}
		ok, err := m.putDecision(ctx, sku, id, st.recRev, value)
		if err != nil {
			return false, err
		}
		if ok {
			return written, nil
		}
	}
	return false, m.wrap(fmt.Errorf("the %s decision of order %q: its record at %s kept changing: retry", value, id, sku))
}

// forgetDecision deletes the committed decision of order id once every
// cluster's lines are confirmed (s's record confirmed stands for it then).
// An error leaves it for Prune.
func (f *fleet) forgetDecision(ctx context.Context, id string, across []string) {
	m, sku, err := f.decisionAt(ctx, across)
	if err != nil {
		return
	}
	dk := m.c.keys.Decision(sku, id)
	_, _ = m.c.kv.Txn(ctx).If(clientv3.Compare(clientv3.Value(dk), "=", decisionCommitted)).Then(clientv3.OpDelete(dk)).Commit()
}

// settled reports whether o, the final record of an order over several
// clusters at its first SKU, may be archived with its decision: unless it
// is confirmed under a committed decision, nothing reads the decision once
// the record is gone but to abort, which is then right; if it is, no other
// cluster's lines may still be reserved (their sweep would abort them).
func (f *fleet) settled(ctx context.Context, o segments.Order) (bool, error) {
	if !o.Active() || o.State != segments.StateConfirmed {
		return true, nil
	}
	m, sku, err := f.decisionAt(ctx, o.Across)
	if err != nil {
		return false, err
	}
	st, err := m.readDecision(ctx, sku, o.ID)
	if err != nil || st.value != decisionCommitted {
		return err == nil, err
	}
	for _, s := range o.Across {
		if slices.Contains(o.Lines, s) {
			continue
		}
		r, err := routeSKU(ctx, f, s, func(e *segments.Engine) (segments.Order, error) { return e.OrderRecord(ctx, s, o.ID) })
		switch {
		case errors.Is(err, ErrOrderNotFound) || errors.Is(err, ErrOrderPruned) || errors.Is(err, ErrUnknownSKU):
		case err != nil:
			return false, err
		case r.Reserved():
			return false, nil
		}
	}
	return true, nil
}

// installDeciders makes every member's segment engine follow the commit
// decisions of orders over several clusters (segments/across.go).
func (f *fleet) installDeciders() {
	d := &segments.Decider{
		Abort: func(ctx context.Context, o segments.Order) (bool, error) {
			ctx, cancel := context.WithTimeout(ctx, decisionTimeout)
			defer cancel()
			return f.abortDecision(ctx, o.ID, o.Across)
		},
		Settled: func(ctx context.Context, o segments.Order) (bool, error) {
			ctx, cancel := context.WithTimeout(ctx, decisionTimeout)
			defer cancel()
			return f.settled(ctx, o)
		},
	}
	for _, m := range f.members {
		m.c.stock.SetDecider(d)
	}
}
