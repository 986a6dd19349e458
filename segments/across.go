package segments

import (
	"context"
	"errors"
)

// Orders over several etcd clusters (Order.Across) are placed by a
// coordinator over several clusters in two phases: each cluster's lines
// reserved as one order there, then a commit decision written in one
// cluster, then every cluster's lines confirmed. The engine does not know
// the other clusters: a Decider, which the coordinator sets on every
// cluster's engine, lets it follow the order's decision where it would
// otherwise give the lines back on its own, so that one cluster's lines are
// never expired while another's are (or will be) confirmed. docs/clusters.md
// states the protocol.

// Decider is what the engine asks about an order over several clusters.
type Decider struct {
	// Abort is called before the engine expires the due, still reserved
	// lines of such an order (the expiry sweep, and a Confirm that finds
	// them past their deadline): it reports committed when the order's
	// decision is to commit (the engine then confirms the lines instead of
	// expiring them); otherwise it has made sure that no commit can follow
	// (the decision is aborted) and the lines are expired. An error leaves
	// the lines reserved (the sweep tries again at its next pass).
	Abort func(ctx context.Context, o Order) (committed bool, err error)
	// Settled is called by Prune (and DeleteSKU) before it archives o, the
	// final record of such an order at its first SKU by name (Across[0]),
	// in whose cluster the decision is kept: true when the decision may go
	// with the record (no line of the order in another cluster still waits
	// for it). False, or an error, keeps the record for a later Prune.
	Settled func(ctx context.Context, o Order) (bool, error)
}

// SetDecider makes the engine follow d for orders over several clusters.
// Without one (a one-cluster coordinator) such lines are expired and
// pruned as any other.
func (e *Engine) SetDecider(d *Decider) { e.decider.Store(d) }

// errConfirmedInstead is returnLines' answer to an expiry of lines whose
// order's decision is committed: it confirmed them instead.
var errConfirmedInstead = errors.New("confirmed by its order's commit decision instead of expired")

// errUndecided wraps the error of a Decider's Abort: the lines stay
// reserved, and the sweep goes on with the other reservations.
var errUndecided = errors.New("its commit decision could not be read or written")

// decidesHere reports whether o is the record that carries its order's
// commit decision in this cluster: an order over several clusters, at its
// first SKU by name.
func decidesHere(o Order) bool { return len(o.Across) > 0 && o.SKU == o.Across[0] }

// abortAcross asks the decider whether o's lines, due, may be expired
// (false) or must be confirmed (true). No decider, or an order in one
// cluster: expired.
func (e *Engine) abortAcross(ctx context.Context, o Order) (bool, error) {
	d := e.decider.Load()
	if d == nil || len(o.Across) == 0 {
		return false, nil
	}
	return d.Abort(ctx, o)
}

// prunableAcross reports whether o may be pruned as far as its order's
// decision is concerned (see Decider.Settled).
func (e *Engine) prunableAcross(ctx context.Context, o Order) bool {
	d := e.decider.Load()
	if d == nil || !decidesHere(o) || o.IsPruned() {
		return true
	}
	ok, err := d.Settled(ctx, o)
	return err == nil && ok
}
