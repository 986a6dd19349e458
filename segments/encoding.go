package segments

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"time"
)

// Version is the encoding version written in every value's "v" field.
const Version = 1

// CorruptError reports a stored value that does not decode. Nothing is
// written when one is returned: the coordinator refuses to build on a value
// it cannot read.
type CorruptError struct {
	Key   string
	Value []byte
	Err   error
}

func (e *CorruptError) Error() string {
	v := e.Value
	if len(v) > 64 {
		v = append(v[:64:64], "..."...)
	}
	return fmt.Sprintf("corrupt value at key %q (%q): %v", e.Key, v, e.Err)
}

func (e *CorruptError) Unwrap() error { return e.Err }

// ErrCorrupt is the sentinel of every *CorruptError (errors.Is).
var ErrCorrupt = errors.New("corrupt value")

// Is makes errors.Is(err, ErrCorrupt) true for a *CorruptError.
func (e *CorruptError) Is(target error) bool { return target == ErrCorrupt }

const (
	counterHead = `{"v":1,"n":`
	counterTail = `}`
)

// EncodeCounter encodes a stock counter. n must be in [0, MaxTotal].
func EncodeCounter(n int64) string {
	if n < 0 || n > MaxTotal {
		panic(fmt.Sprintf("segments: counter %d out of range", n))
	}
	return counterHead + strconv.FormatInt(n, 10) + counterTail
}

// DecodeCounter decodes a counter stored at key. It accepts exactly the
// bytes EncodeCounter writes: JSON, but with no freedom of spacing or order,
// so that a hand-edited or foreign value is caught rather than guessed at.
//
// A segment's counter may also be in the lazy form (EncodeSegmentCounter):
// DecodeCounter then returns its N, the segment's units as of its base
// revision; orders sold from it since are in their records only, so N is
// an upper bound. The exact figure is the engine's (Status, Audit).
func DecodeCounter(key string, value []byte) (int64, error) {
	if bytes.HasPrefix(value, []byte(lazyHead)) {
		c, err := DecodeSegmentCounter(key, value)
		return c.N, err
	}
	return decodeExact(key, value)
}

func decodeExact(key string, value []byte) (int64, error) {
	digits, ok := bytes.CutPrefix(value, []byte(counterHead))
	if ok {
		digits, ok = bytes.CutSuffix(digits, []byte(counterTail))
	}
	if !ok {
		return 0, &CorruptError{Key: key, Value: value, Err: fmt.Errorf("want %sN%s", counterHead, counterTail)}
	}
	return decodeDigits(key, value, digits)
}

func decodeDigits(key string, value, digits []byte) (int64, error) {
	if len(digits) == 0 || len(digits) > 19 || (len(digits) > 1 && digits[0] == '0') {
		return 0, &CorruptError{Key: key, Value: value, Err: fmt.Errorf("number %q is not canonical", digits)}
	}
	var n int64
	for _, c := range digits {
		if c < '0' || c > '9' {
			return 0, &CorruptError{Key: key, Value: value, Err: fmt.Errorf("counter %q is not a non-negative integer", digits)}
		}
		n = n*10 + int64(c-'0')
		if n > MaxTotal {
			return 0, &CorruptError{Key: key, Value: value, Err: fmt.Errorf("counter exceeds the maximum %d", MaxTotal)}
		}
	}
	return n, nil
}

// SegmentCounter is a segment's counter as stored. A segment is either
// exact (its counter is its units: every commit that sells from it writes
// it) or lazy: one process, its Owner, sells from it without writing the
// counter, each order writing only its record. A lazy segment holds
//
//	N − Σ the parts taken from it by order records created after Base
//
// and that is what the books, Status, Audit and every look count. Its
// owner fences its sales by comparing the counter's ModRevision: whoever
// else writes the counter (a lock holder marking it, another process taking
// it over, a settle) ends the owner's lazy sales at that revision, and the
// records before it are final.
type SegmentCounter struct {
	// N is the segment's units as of Base.
	N int64
	// Base is the revision the lazy sales are counted from; 0 means the
	// counter's own ModRevision (a counter written with its exact units).
	Base int64
	// Owner is the lease ID of the process that sells from the segment
	// without its lock; 0: none.
	Owner int64
}

// Lazy reports whether orders may have been sold from the segment since
// its counter was written without writing it: its units are N minus those
// orders' parts.
func (c SegmentCounter) Lazy() bool { return c.Owner != 0 || c.Base != 0 }

// BaseAt is the revision lazy sales are counted from, for a counter whose
// ModRevision is modRev.
func (c SegmentCounter) BaseAt(modRev int64) int64 {
	if c.Base != 0 {
		return c.Base
	}
	return modRev
}

const lazyHead = `{"v":2,"n":`

// EncodeSegmentCounter encodes a segment's counter: the exact form
// (EncodeCounter) when it is not lazy, else
// {"v":2,"n":N[,"base":B][,"owner":"<lease hex>"]}, fields in that order.
func EncodeSegmentCounter(c SegmentCounter) string {
	if !c.Lazy() {
		return EncodeCounter(c.N)
	}
	if c.N < 0 || c.N > MaxTotal || c.Base < 0 || c.Owner < 0 {
		panic(fmt.Sprintf("segments: segment counter %+v out of range", c))
	}
	out := lazyHead + strconv.FormatInt(c.N, 10)
	if c.Base != 0 {
		out += `,"base":` + strconv.FormatInt(c.Base, 10)
	}
	if c.Owner != 0 {
		out += `,"owner":"` + strconv.FormatInt(c.Owner, 16) + `"`
	}
	return out + counterTail
}

// DecodeSegmentCounter decodes a segment's counter in either form, as
// strictly as DecodeCounter.
func DecodeSegmentCounter(key string, value []byte) (SegmentCounter, error) {
	rest, ok := bytes.CutPrefix(value, []byte(lazyHead))
	if !ok {
		n, err := decodeExact(key, value)
		return SegmentCounter{N: n}, err
	}
	bad := func(why string) (SegmentCounter, error) {
		return SegmentCounter{}, &CorruptError{Key: key, Value: value, Err: errors.New(why)}
	}
	rest, ok = bytes.CutSuffix(rest, []byte(counterTail))
	if !ok {
		return bad("a lazy segment counter must end with }")
	}
	num, rest, _ := bytes.Cut(rest, []byte(","))
	var c SegmentCounter
	var err error
	if c.N, err = decodeDigits(key, value, num); err != nil {
		return SegmentCounter{}, err
	}
	if b, ok := bytes.CutPrefix(rest, []byte(`"base":`)); ok {
		num, rest, _ = bytes.Cut(b, []byte(","))
		if c.Base, err = decodeDigits(key, value, num); err != nil {
			return SegmentCounter{}, err
		}
		if c.Base == 0 {
			return bad("a base of 0 is written by leaving it out")
		}
	}
	if o, ok := bytes.CutPrefix(rest, []byte(`"owner":"`)); ok {
		hex, tail, _ := bytes.Cut(o, []byte(`"`))
		if len(tail) != 0 || len(hex) == 0 || len(hex) > 16 || (len(hex) > 1 && hex[0] == '0') {
			return bad("owner must be a lease ID in lower-case hex")
		}
		u, perr := strconv.ParseUint(string(hex), 16, 63)
		if perr != nil || strconv.FormatUint(u, 16) != string(hex) || u == 0 {
			return bad("owner must be a lease ID in lower-case hex")
		}
		c.Owner, rest = int64(u), nil
	}
	if len(rest) != 0 {
		return bad(`want {"v":2,"n":N[,"base":B][,"owner":"<hex>"]}`)
	}
	if !c.Lazy() {
		return bad("a segment counter that is not lazy is written in the v1 form")
	}
	return c, nil
}

// Meta is a SKU's meta record.
type Meta struct {
	V int `json:"v"`
	// Total is all stock ever put in: the initial total plus every restock.
	// It changes only by restock; allocations and releases move stock
	// between places and orders without changing it.
	Total int64 `json:"total"`
	// Segments is the segment count, fixed at creation.
	Segments int `json:"segments"`
	// LowWatermark: the rebalancer refills a segment whose stock falls below it.
	LowWatermark int64 `json:"lowWatermark"`
	// RefillBatch is how much the rebalancer moves into a segment at once.
	RefillBatch int64 `json:"refillBatch"`
	// PerUserLimit is the most units one buyer may hold of the SKU at once
	// (confirmed and live reserved orders together); 0 means no limit.
	// Fixed at creation. Records written before it existed decode as 0.
	PerUserLimit int64 `json:"perUserLimit,omitempty"`
	// Creating is set while CreateSKU is still moving the initial fill from
	// the pool into the segments; such a SKU serves no requests yet.
	Creating bool `json:"creating,omitempty"`
	// InitialFill is the part of the total CreateSKU puts in the segments.
	// It is recorded while Creating, so that resuming an interrupted
	// creation with another fill is a conflict. A completed record keeps
	// it when the transaction that completed the creation also wrote the
	// whole fill: the segments' counters are then as born at the record's
	// ModRevision, which a seller's first order uses as its fence without
	// reading them (bornInto). Every other write of the record (a
	// restock, a policy change) drops it, and older records have 0.
	// CreateSKU's result carries it.
	InitialFill int64     `json:"initialFill,omitempty"`
	Created     time.Time `json:"created"`
}

// Validate checks the record's fields against the documented limits.
func (m *Meta) Validate() error {
	switch {
	case m.Total < 0 || m.Total > MaxTotal:
		return invalid("total", m.Total, "must be between 0 and %d", MaxTotal)
	case m.Segments < 1 || m.Segments > MaxSegments:
		return invalid("segments", m.Segments, "must be between 1 and %d", MaxSegments)
	case m.LowWatermark < 0 || m.LowWatermark > MaxTotal:
		return invalid("low watermark", m.LowWatermark, "must be between 0 and %d", MaxTotal)
	case m.RefillBatch < 0 || m.RefillBatch > MaxTotal:
		return invalid("refill batch", m.RefillBatch, "must be between 0 and %d", MaxTotal)
	case m.PerUserLimit < 0 || m.PerUserLimit > MaxQty:
		return invalid("per-user limit", m.PerUserLimit, "must be between 0 (none) and %d", MaxQty)
	case m.InitialFill < 0 || m.InitialFill > m.Total:
		return invalid("initial fill", m.InitialFill, "must be between 0 and the total %d", m.Total)
	}
	return nil
}

// EncodeMeta encodes m with the current version.
func EncodeMeta(m Meta) string {
	m.V = Version
	return mustJSON(m)
}

// DecodeMeta strictly decodes the meta record stored at key.
func DecodeMeta(key string, value []byte) (Meta, error) {
	m, ok := decodeMetaFast(value)
	if !ok {
		if err := strictJSON(value, &m); err != nil {
			return Meta{}, &CorruptError{Key: key, Value: value, Err: err}
		}
	}
	if err := checkVersion(m.V); err != nil {
		return Meta{}, &CorruptError{Key: key, Value: value, Err: err}
	}
	if err := m.Validate(); err != nil {
		return Meta{}, &CorruptError{Key: key, Value: value, Err: err}
	}
	return m, nil
}

// Part is the quantity an order took from one place.
type Part struct {
	Place Place `json:"from"`
	Qty   int64 `json:"qty"`
}

// OrderState is where an order stands in the reservation lifecycle.
type OrderState string

// Order states. A plain allocation has no state (""): it is final at once,
// as every order written before reservations existed is.
const (
	// StateReserved: the order holds its units until its Deadline, waiting
	// for a Confirm (payment).
	StateReserved OrderState = "reserved"
	// StateConfirmed: a reservation made final by Confirm. It holds its
	// units like a plain allocation.
	StateConfirmed OrderState = "confirmed"
	// StateExpired: a reservation that reached its deadline unconfirmed;
	// its units went back in the transaction that set this state.
	StateExpired OrderState = "expired"
	// StatePruned: the record of an order that Prune archived, kept only
	// as its ID's claim (no quantity, no parts) until its retention ends,
	// so that a retry of the order is refused (ErrOrderPruned). It holds
	// nothing: what the order held is in the SKU's archive record.
	StatePruned OrderState = "pruned"
)

// Order is the record of one allocation. It is written in the same etcd
// transaction as the deduction it records, so the two cannot disagree.
type Order struct {
	V   int    `json:"v"`
	SKU string `json:"sku"`
	ID  string `json:"order"`
	// Qty and Parts are never empty but in a pruned order's claim (which
	// omits them).
	Qty   int64  `json:"qty,omitempty"`
	Parts []Part `json:"parts,omitempty"`
	// Released is set by Release (or Cancel), in the transaction that
	// returns the parts.
	Released bool      `json:"released,omitempty"`
	Created  time.Time `json:"created,omitzero"`
	// State is "" for a plain allocation, else the reservation's state.
	State OrderState `json:"state,omitempty"`
	// Deadline is when a reservation expires unless confirmed, by the clock
	// of the process that committed it. Zero for a plain allocation.
	Deadline time.Time `json:"deadline,omitzero"`
	// Buyer is who the order is for, when the caller said so.
	Buyer string `json:"buyer,omitempty"`
	// UserCounted says the order's units are counted in its buyer's
	// per-user counter (the SKU had a per-user limit when it was placed):
	// whatever returns the units also takes them off that counter.
	UserCounted bool `json:"userCounted,omitempty"`
	// Lines is set on the records of an order of several lines
	// (AllocateOrder, ReserveOrder): the SKUs of all its lines, sorted.
	// Every line has its record (at its own SKU's key, under the same
	// order ID), written in one transaction with the others, and each
	// lists them all, so that a replay, a release, a confirm or an expiry
	// found through one line reaches the whole order.
	Lines []string `json:"lines,omitempty"`
	// Across is set on the records of an order of several lines whose
	// SKUs are in several etcd clusters (a coordinator over several
	// clusters reserves each cluster's lines as one order of its own, under
	// the same ID, WithAcross): the SKUs of every line of the whole order,
	// sorted, in every cluster. Lines are this cluster's only.
	Across []string `json:"across,omitempty"`
	// PrunedAt is when Prune archived the order (StatePruned only), by the
	// clock of the pruning process: its claim is kept for the retention
	// Prune is given from then.
	PrunedAt time.Time `json:"prunedAt,omitzero"`
}

// Active reports whether the order still holds its stock: it was neither
// released nor, as a reservation, expired.
func (o *Order) Active() bool {
	return !o.Released && o.State != StateExpired && o.State != StatePruned
}

// IsPruned reports whether the record is a pruned order's claim
// (StatePruned): not an order any more, only its ID kept.
func (o *Order) IsPruned() bool { return o.State == StatePruned }

// prunedClaim is what Prune leaves of order o: its ID's claim, and when
// (to the second), nothing more: claims are kept by the thousand, in an
// etcd that may be near its quota (~90 bytes each, a record ~200).
func prunedClaim(o Order, at time.Time) Order {
	return Order{SKU: o.SKU, ID: o.ID, State: StatePruned, PrunedAt: at.UTC().Truncate(time.Second)}
}

// Reserved reports whether the order is a live reservation: it holds its
// units and waits for a Confirm.
func (o *Order) Reserved() bool { return o.Active() && o.State == StateReserved }

// EncodeOrder encodes o with the current version: what json.Marshal
// gives, byte for byte (FuzzEncodeOrder), without its reflection for a
// plain order or a reservation, whose record every order's commit writes.
// An order of several lines, a pruned claim, or a string that JSON must
// escape, is marshalled by encoding/json.
func EncodeOrder(o Order) string {
	o.V = Version
	if b, ok := appendOrder(make([]byte, 0, 192+32*len(o.Parts)), &o); ok {
		return string(b)
	}
	return mustJSON(o)
}

// appendOrder appends o as json.Marshal encodes it, or reports false where
// it leaves that to json.Marshal (see EncodeOrder).
func appendOrder(b []byte, o *Order) ([]byte, bool) {
	if len(o.Lines) > 0 || len(o.Across) > 0 || !o.PrunedAt.IsZero() || !plainJSON(o.SKU) || !plainJSON(o.ID) ||
		!plainJSON(string(o.State)) || !plainJSON(o.Buyer) || !rfc3339Year(o.Created) || !rfc3339Year(o.Deadline) {
		return b, false
	}
	b = append(b, `{"v":`...)
	b = strconv.AppendInt(b, int64(o.V), 10)
	b = append(b, `,"sku":"`...)
	b = append(b, o.SKU...)
	b = append(b, `","order":"`...)
	b = append(b, o.ID...)
	b = append(b, '"')
	if o.Qty != 0 {
		b = append(b, `,"qty":`...)
		b = strconv.AppendInt(b, o.Qty, 10)
	}
	if len(o.Parts) > 0 {
		b = append(b, `,"parts":[`...)
		for i, p := range o.Parts {
			if p.Place < Pool {
				return b, false // json.Marshal's error, from MarshalText
			}
			if i > 0 {
				b = append(b, ',')
			}
			b = append(b, `{"from":"`...)
			if p.Place.IsPool() {
				b = append(b, "pool"...)
			} else {
				b = append(b, "seg/"...)
				b = strconv.AppendInt(b, int64(p.Place), 10)
			}
			b = append(b, `","qty":`...)
			b = strconv.AppendInt(b, p.Qty, 10)
			b = append(b, '}')
		}
		b = append(b, ']')
	}
	if o.Released {
		b = append(b, `,"released":true`...)
	}
	b = appendTimeField(b, `,"created":"`, o.Created)
	if o.State != "" {
		b = append(b, `,"state":"`...)
		b = append(b, o.State...)
		b = append(b, '"')
	}
	b = appendTimeField(b, `,"deadline":"`, o.Deadline)
	if o.Buyer != "" {
		b = append(b, `,"buyer":"`...)
		b = append(b, o.Buyer...)
		b = append(b, '"')
	}
	if o.UserCounted {
		b = append(b, `,"userCounted":true`...)
	}
	return append(b, '}'), true
}

// appendTimeField appends field (its comma, name and opening quote) and t
// as time.Time's MarshalJSON writes it, unless t is zero (omitzero).
func appendTimeField(b []byte, field string, t time.Time) []byte {
	if t.IsZero() {
		return b
	}
	b = t.AppendFormat(append(b, field...), time.RFC3339Nano)
	return append(b, '"')
}

// plainJSON reports whether json.Marshal writes s as it is between quotes:
// printable ASCII, without the quote, the backslash and the characters it
// escapes for HTML.
func plainJSON(s string) bool {
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c < 0x20 || c > 0x7e, c == '"', c == '\\', c == '<', c == '>', c == '&':
			return false
		}
	}
	return true
}

// rfc3339Year reports whether t is zero or a time json.Marshal encodes as
// RFC 3339 (a four-digit year; its offset in whole minutes).
func rfc3339Year(t time.Time) bool {
	if t.IsZero() {
		return true
	}
	_, off := t.Zone()
	return t.Year() >= 0 && t.Year() <= 9999 && off%60 == 0 && off > -24*3600 && off < 24*3600
}

// DecodeOrder strictly decodes the order record stored at key, including
// that its parts add up to its quantity.
func DecodeOrder(key string, value []byte) (Order, error) {
	o, fast := decodeOrderFast(value)
	if !fast {
		if err := strictJSON(value, &o); err != nil {
			return Order{}, &CorruptError{Key: key, Value: value, Err: err}
		}
	}
	if err := checkVersion(o.V); err != nil {
		return Order{}, &CorruptError{Key: key, Value: value, Err: err}
	}
	if o.State == StatePruned || !o.PrunedAt.IsZero() {
		if o.State != StatePruned || o.PrunedAt.IsZero() || o.Qty != 0 || len(o.Parts) != 0 || o.Released ||
			!o.Deadline.IsZero() || o.Buyer != "" || o.UserCounted {
			return Order{}, &CorruptError{Key: key, Value: value, Err: errors.New("a pruned order's claim must carry only its SKU, ID and pruning time")}
		}
		if ValidateSKU(o.SKU) != nil || ValidateOrderID(o.ID) != nil {
			return Order{}, &CorruptError{Key: key, Value: value, Err: errors.New("invalid sku or order id")}
		}
		return o, nil
	}
	var sum int64
	for _, p := range o.Parts {
		if p.Qty < 1 || p.Qty > MaxQty {
			return Order{}, &CorruptError{Key: key, Value: value, Err: fmt.Errorf("part %v has qty %d", p.Place, p.Qty)}
		}
		sum += p.Qty
	}
	if err := ValidateQty(o.Qty); err != nil || sum != o.Qty {
		return Order{}, &CorruptError{Key: key, Value: value, Err: fmt.Errorf("qty %d does not match its parts (sum %d)", o.Qty, sum)}
	}
	if ValidateSKU(o.SKU) != nil || ValidateOrderID(o.ID) != nil {
		return Order{}, &CorruptError{Key: key, Value: value, Err: errors.New("invalid sku or order id")}
	}
	switch o.State {
	case "", StateReserved, StateConfirmed, StateExpired:
	default:
		return Order{}, &CorruptError{Key: key, Value: value, Err: fmt.Errorf("unknown state %q", o.State)}
	}
	if (o.State == "") != o.Deadline.IsZero() {
		return Order{}, &CorruptError{Key: key, Value: value, Err: errors.New("a reservation state without a deadline, or the reverse")}
	}
	if o.Buyer != "" && ValidateBuyer(o.Buyer) != nil || o.UserCounted && o.Buyer == "" {
		return Order{}, &CorruptError{Key: key, Value: value, Err: errors.New("invalid buyer")}
	}
	if o.Lines != nil && !validRecordLines(o.SKU, o.Lines) {
		return Order{}, &CorruptError{Key: key, Value: value, Err: errors.New("invalid lines: want 1 to MaxOrderLines distinct SKUs, sorted, its own among them")}
	}
	return o, nil
}

func checkVersion(v int) error {
	if v != Version {
		return fmt.Errorf("version %d, want %d", v, Version)
	}
	return nil
}

func strictJSON(value []byte, dst any) error {
	dec := json.NewDecoder(bytes.NewReader(value))
	dec.DisallowUnknownFields()
	if err := dec.Decode(dst); err != nil {
		return err
	}
	if _, err := dec.Token(); err != io.EOF {
		return errors.New("trailing data after the JSON value")
	}
	return nil
}

func mustJSON(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		panic(fmt.Sprintf("segments: encoding %T: %v", v, err))
	}
	return string(b)
}

// RebalancePass is the rebalancer's record of its last pass, kept where
// status can show it.
type RebalancePass struct {
	V int `json:"v"`
	// Leader identifies the rebalancer that made the pass (host, pid, lease).
	Leader string `json:"leader"`
	// At is when the pass ended.
	At time.Time `json:"at"`
	// Moves counts the transfers made by the pass; Moved the units moved.
	Moves int   `json:"moves"`
	Moved int64 `json:"moved"`
	// Revision is the revision of the pass's last move, or of its last read.
	Revision int64 `json:"revision"`
	// Totals since this leader was elected.
	TotalMoves int   `json:"totalMoves"`
	TotalMoved int64 `json:"totalMoved"`
}

// EncodeRebalancePass encodes p with the current version.
func EncodeRebalancePass(p RebalancePass) string {
	p.V = Version
	return mustJSON(p)
}

// DecodeRebalancePass strictly decodes a pass record stored at key.
func DecodeRebalancePass(key string, value []byte) (RebalancePass, error) {
	var p RebalancePass
	if err := strictJSON(value, &p); err != nil {
		return RebalancePass{}, &CorruptError{Key: key, Value: value, Err: err}
	}
	if err := checkVersion(p.V); err != nil {
		return RebalancePass{}, &CorruptError{Key: key, Value: value, Err: err}
	}
	return p, nil
}

// Pull is the record of the last move a selling process made from a SKU's
// pool into a segment it holds (an order found no stock in its segments).
// It is written in the move's transaction, so etcd's history tells every
// pull apart from the rebalancer's refills.
type Pull struct {
	V       int   `json:"v"`
	Segment int   `json:"segment"`
	Qty     int64 `json:"qty"`
	// Lease is the session lease of the process that pulled, in hex.
	Lease string    `json:"lease"`
	At    time.Time `json:"at"`
}

// EncodePull encodes p with the current version.
func EncodePull(p Pull) string {
	p.V = Version
	return mustJSON(p)
}

// DecodePull strictly decodes a pull record stored at key.
func DecodePull(key string, value []byte) (Pull, error) {
	var p Pull
	if err := strictJSON(value, &p); err != nil {
		return Pull{}, &CorruptError{Key: key, Value: value, Err: err}
	}
	if err := checkVersion(p.V); err != nil {
		return Pull{}, &CorruptError{Key: key, Value: value, Err: err}
	}
	return p, nil
}
