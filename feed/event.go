package feed

import (
	"cmp"
	"fmt"
	"slices"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"

	"github.com/stockctl/stockctl/internal/keys"
	"github.com/stockctl/stockctl/segments"
)

// Kind says what happened to an order. It is also the order's state after
// the event, which is what a table of orders keeps.
type Kind string

// The kinds of events, one per transition of an order record. Every write
// the coordinator makes to an order record is exactly one of them.
const (
	// Allocated: a plain order took its units (Allocate, AllocateFunc). Final
	// unless released.
	Allocated Kind = "allocated"
	// Reserved: a reservation took its units until its Deadline (Reserve).
	Reserved Kind = "reserved"
	// Confirmed: a reservation was paid (Confirm). Final unless released.
	Confirmed Kind = "confirmed"
	// Cancelled: a live reservation gave its units back (Cancel, or Release
	// of a reservation that was never confirmed).
	Cancelled Kind = "cancelled"
	// Released: an allocated or confirmed order gave its units back
	// (Release).
	Released Kind = "released"
	// Expired: a reservation reached its deadline unconfirmed; its units
	// went back in the same transaction.
	Expired Kind = "expired"
)

// Kinds lists every kind, in lifecycle order.
var Kinds = []Kind{Allocated, Reserved, Confirmed, Cancelled, Released, Expired}

// Active reports whether an order whose latest event is of kind k holds
// its units: allocated, reserved or confirmed.
func (k Kind) Active() bool { return k == Allocated || k == Reserved || k == Confirmed }

// Event is one change to one order, as committed in etcd.
//
// The order's fields (Qty, Parts, Buyer, Deadline, Created) are the order
// record's as written by the change: an order's quantity, parts, buyer and
// deadline never change after it is placed, so every event of an order
// carries the same ones.
type Event struct {
	// Revision is the etcd revision of the transaction that made the
	// change. Several events can share one (a group commit places many
	// orders in one transaction; an expiry sweep expires many).
	Revision int64
	// Kind is what happened, and the order's state after it.
	Kind Kind
	// SKU and Order identify the order. Order IDs are unique per SKU: (SKU, Order) names an order.
	SKU   string
	Order string
	Qty   int64
	// Parts says where the units came from. An event that gives them back
	// puts them in the inbox of the SKU's segment the order's ID routes
	// to, whichever places they came from (stock is fungible).
	Parts []segments.Part
	// Buyer is who the order is for, when the caller said so.
	Buyer string
	// Reservation is true for an order placed with Reserve, whatever
	// became of it; Deadline is then its deadline (the committing
	// process's clock plus the TTL), else zero.
	Reservation bool
	Deadline    time.Time
	// Created is when the order was placed (the committing process's
	// clock). etcd keeps no time for later transitions: their Revision is
	// what orders them.
	Created time.Time
	// Lines is set for an order of several lines (AllocateOrder,
	// ReserveOrder): the SKUs of all its lines, sorted. Each line is an
	// event of its own, and every transition of the order writes every
	// line in one transaction: its len(Lines) events share one Revision,
	// so they arrive in one Batch (a batch holds whole revisions) and a
	// consumer applies the order in one transaction. A feed of one SKU
	// sees only that SKU's line. Nil for an order of one SKU.
	Lines []string
	// Across is set for an order of several lines whose SKUs are in
	// several clusters (a coordinator over several clusters): the SKUs of
	// the whole order, in every cluster, sorted. Each cluster's lines are
	// an order of their own there (Lines, one Revision of that cluster); the
	// other clusters' events of the order ID come at their own clusters'
	// revisions (a merged feed delivers each cluster's in its own batches).
	Across []string
	// Version counts the writes to the order record up to this one: 1 for
	// the event that placed the order. Two events of one order always have
	// increasing Revision and Version.
	Version int64
}

// kindOf says which transition wrote record o. It needs only the record
// written, not the one before it, because every coordinator write to an
// order record moves it to a state no earlier write had:
//
//	State ""         Released false → Allocated   (placed by Allocate)
//	State reserved   Released false → Reserved    (placed by Reserve)
//	State confirmed  Released false → Confirmed   (Confirm)
//	State reserved   Released true  → Cancelled   (Cancel, or Release of a live reservation)
//	State "" or confirmed, Released true → Released (Release)
//	State expired                    → Expired     (the sweep, or a late Confirm)
//
// So a feed that starts in the middle of history, or a snapshot that sees
// only the latest record, names each change exactly.
func kindOf(o *segments.Order) Kind {
	switch {
	case o.State == segments.StateExpired:
		return Expired
	case o.Released && o.State == segments.StateReserved:
		return Cancelled
	case o.Released:
		return Released
	case o.State == segments.StateReserved:
		return Reserved
	case o.State == segments.StateConfirmed:
		return Confirmed
	}
	return Allocated
}

// decode turns an order record, as a watch or a range read returns it,
// into an event. The record must sit at the key its own SKU and ID call
// for, under the feed's scope; anything else is a *segments.CorruptError,
// never skipped: a feed that skipped a record would not be gapless. The
// claim Prune leaves of an archived order (segments.StatePruned) is no
// order event, as the delete of a record is not: ok is false.
func decode(space keys.Space, kv *mvccpb.KeyValue) (e Event, ok bool, err error) {
	key := string(kv.Key)
	o, err := segments.DecodeOrder(key, kv.Value)
	if err != nil {
		return Event{}, false, err
	}
	if space.Order(o.SKU, o.ID) != key {
		return Event{}, false, &segments.CorruptError{Key: key, Value: kv.Value,
			Err: fmt.Errorf("record names SKU %q order %q, which live elsewhere", o.SKU, o.ID)}
	}
	if o.IsPruned() {
		return Event{}, false, nil
	}
	return Event{
		Revision:    kv.ModRevision,
		Kind:        kindOf(&o),
		SKU:         o.SKU,
		Order:       o.ID,
		Qty:         o.Qty,
		Parts:       o.Parts,
		Buyer:       o.Buyer,
		Reservation: o.State != "",
		Deadline:    o.Deadline,
		Created:     o.Created,
		Lines:       o.Lines,
		Across:      o.Across,
		Version:     kv.Version,
	}, true, nil
}

// sortEvents puts events in the feed's order: by revision, and within a
// revision by SKU, then order ID. etcd forbids a transaction to write one
// key twice, so (Revision, SKU, Order) names an event uniquely and this
// order is total: every feed of the same history, live or replayed, of one
// SKU or of all, delivers the same events in the same order.
func sortEvents(evs []Event) {
	slices.SortFunc(evs, func(a, b Event) int {
		return cmp.Or(cmp.Compare(a.Revision, b.Revision), cmp.Compare(a.SKU, b.SKU), cmp.Compare(a.Order, b.Order))
	})
}
