// Package keys builds every etcd key stockctl reads or writes, and parses
// them back. Nothing else in the module concatenates key strings, so the
// layout below is the whole truth about what lives where in etcd.
//
// Layout under a prefix P (default "/stockctl/"):
//
//	P locks/<name>/<lease>           named locks (one waiter key per session);
//	                                 shared keys, semaphores and lock-delay
//	                                 records: see locks.go
//	P meta/<sku>                     SKU meta record (total, segments, policy)
//	P stock/<sku>/pool               central pool counter
//	P stock/<sku>/seg/<iiii>         segment counter, guarded by the segment lock
//	P stock/<sku>/in/<iiii>          segment inbox: stock moved in by the rebalancer,
//	                                 absorbed into the segment by its lock holder
//	P stocklocks/<sku>/pool/<lease>  lock of the pool
//	P stocklocks/<sku>/seg/<iiii>/<lease>  lock of segment i
//	P orders/<sku>/<order>           order records of one SKU; a record is also
//	                                 its order ID's claim (IDs are unique per SKU)
//	P orderid/<order>                legacy: the global order-ID claim that
//	                                 stockctl wrote before records were their
//	                                 own claims; read by nothing, deleted by
//	                                 prune and delete
//	P rebalance/election/<lease>     rebalancer leadership (concurrency.Election)
//	P rebalance/last                 the rebalancer's last pass
//	P pulls/<sku>                    the last move a selling process made from the
//	                                 pool into one of its segments
//	P reservations/<sku>/<deadline>/<order>  one per live reservation; the
//	                                 deadline in unix nanoseconds, 19 digits, so
//	                                 that keys sort by deadline (value: the qty)
//	P users/<sku>/<buyer>            units a buyer holds of sku (confirmed and live
//	                                 reserved), kept only for SKUs with a per-user limit
//	P deliveries/<sku>/<delivery>    the record of one restock (its qty, the total
//	                                 and pool after it)
//	P deliveryid/<delivery>          global delivery-ID claim (value: the SKU)
//	P archive/<sku>                  what pruned orders of sku held and how many there
//	                                 were (written with the deletes that prune them)
//	P sellers/<seat>                 a process that sells directly: its seat, the
//	                                 smallest number no other live process holds
//	                                 (bound to its lease), which keeps its direct
//	                                 orders of a SKU off the segments of the others
//
// Segment indices are written with four decimal digits so that keys sort in
// index order (the maximum segment count is 1024).
//
// Meta records live outside stock/ so that listing SKUs reads no counters,
// and counters live outside orders/ so that watching stock/ (the rebalancer)
// never sees order traffic.
package keys

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// SegmentDigits is the fixed width of a segment index in a key.
const SegmentDigits = 4

// maxIndex is the largest index SegmentDigits can hold.
const maxIndex = 9999

// Space builds keys under one prefix. The zero value is not usable; call New.
type Space struct {
	prefix string
}

// New returns the key space under prefix. The prefix must be non-empty and
// printable; a trailing "/" is added when missing so that two prefixes such
// as "/a" and "/ab" never share keys.
func New(prefix string) (Space, error) {
	if prefix == "" {
		return Space{}, errors.New("keys: prefix is empty")
	}
	for i := 0; i < len(prefix); i++ {
		if prefix[i] < 0x20 || prefix[i] == 0x7f {
			return Space{}, fmt.Errorf("keys: prefix %q contains a control character", prefix)
		}
	}
	if !strings.HasSuffix(prefix, "/") {
		prefix += "/"
	}
	return Space{prefix: prefix}, nil
}

// Prefix is the space's prefix, always ending in "/".
func (s Space) Prefix() string { return s.prefix }

// SpaceReserve is the key of the space reserve: room in etcd's quota that
// `stockctl reclaim` frees under NOSPACE (segments.SpaceReserveBytes).
func (s Space) SpaceReserve() string { return s.prefix + "space-reserve" }

// Lock is the key prefix of the named lock; waiter keys are Lock(name)+<lease id>.
// The name must not contain "/" (callers validate it), or one lock's prefix
// could contain another's waiters.
func (s Space) Lock(name string) string { return s.prefix + "locks/" + name + "/" }

// SellersPrefix is the prefix of the direct sellers' seats: seat n's key
// is the prefix and n in decimal (internal/seats writes and parses them).
func (s Space) SellersPrefix() string { return s.prefix + "sellers/" }

// MetaPrefix is the prefix of all SKU meta records (listing it lists SKUs).
func (s Space) MetaPrefix() string { return s.prefix + "meta/" }

// Meta is the meta record of sku.
func (s Space) Meta(sku string) string { return s.MetaPrefix() + sku }

// StockPrefix is the prefix of every stock counter of every SKU.
func (s Space) StockPrefix() string { return s.prefix + "stock/" }

// SKUStock is the prefix of sku's pool, segment and inbox counters.
func (s Space) SKUStock(sku string) string { return s.StockPrefix() + sku + "/" }

// Pool is sku's central pool counter.
func (s Space) Pool(sku string) string { return s.SKUStock(sku) + "pool" }

// Segment is the counter of segment i of sku.
func (s Space) Segment(sku string, i int) string { return s.SKUStock(sku) + "seg/" + index(i) }

// Inbox is the inbox counter of segment i of sku.
func (s Space) Inbox(sku string, i int) string { return s.SKUStock(sku) + "in/" + index(i) }

// PoolLock is the lock prefix guarding sku's pool.
func (s Space) PoolLock(sku string) string { return s.StockLocks(sku) + "pool/" }

// SegmentLock is the lock prefix guarding segment i of sku.
func (s Space) SegmentLock(sku string, i int) string {
	return s.StockLocks(sku) + "seg/" + index(i) + "/"
}

// Orders is the prefix of sku's order records.
func (s Space) Orders(sku string) string { return s.prefix + "orders/" + sku + "/" }

// Order is the record of order id of sku.
func (s Space) Order(sku, id string) string { return s.Orders(sku) + id }

// OrderID is the legacy global claim of order id, written by stockctl
// before an order's record became its own claim. Nothing writes or reads it
// now; prune deletes those of the orders it archives.
func (s Space) OrderID(id string) string { return s.prefix + "orderid/" + id }

// Election is the prefix of the rebalancer's leadership election.
func (s Space) Election() string { return s.prefix + "rebalance/election" }

// Pull is the record of the last pull from sku's pool by a selling process.
func (s Space) Pull(sku string) string { return s.prefix + "pulls/" + sku }

// RebalanceLast is the record of the rebalancer's last pass.
func (s Space) RebalanceLast() string { return s.prefix + "rebalance/last" }

// DeadlineDigits is the fixed width of a deadline (unix nanoseconds) in a
// reservation key: every time from 1970 to 2286 fits.
const DeadlineDigits = 19

// Reservations is the prefix of sku's reservation index.
func (s Space) Reservations(sku string) string { return s.prefix + "reservations/" + sku + "/" }

// Reservation is the index key of order's reservation of sku, due at
// deadline (unix nanoseconds, non-negative).
func (s Space) Reservation(sku string, deadline int64, order string) string {
	return s.Reservations(sku) + deadlineDigits(deadline) + "/" + order
}

// ReservationsDueEnd is the exclusive end of the range, from
// Reservations(sku), of reservations due at or before at (unix nanoseconds).
func (s Space) ReservationsDueEnd(sku string, at int64) string {
	return s.Reservations(sku) + deadlineDigits(at+1)
}

func deadlineDigits(ns int64) string {
	if ns < 0 {
		ns = 0
	}
	d := strconv.FormatInt(ns, 10)
	return strings.Repeat("0", max(0, DeadlineDigits-len(d))) + d
}

// ReservationsPrefix is the prefix of every SKU's reservation index keys.
func (s Space) ReservationsPrefix() string { return s.prefix + "reservations/" }

// ReservationSKU is the SKU of a key under ReservationsPrefix.
func (s Space) ReservationSKU(key string) (string, error) {
	rest, ok := strings.CutPrefix(key, s.ReservationsPrefix())
	sku, _, found := strings.Cut(rest, "/")
	if !ok || !found || sku == "" {
		return "", fmt.Errorf("keys: %q is not a reservation key", key)
	}
	return sku, nil
}

// ParseReservation returns the deadline (unix nanoseconds) and the order of
// a key under Reservations(sku).
func (s Space) ParseReservation(sku, key string) (int64, string, error) {
	rest, ok := strings.CutPrefix(key, s.Reservations(sku))
	if !ok {
		return 0, "", fmt.Errorf("keys: %q is not a reservation key of %q", key, sku)
	}
	d, order, ok := strings.Cut(rest, "/")
	if !ok || len(d) != DeadlineDigits || order == "" || strings.Contains(order, "/") {
		return 0, "", fmt.Errorf("keys: %q is not a reservation key of %q", key, sku)
	}
	ns, err := strconv.ParseInt(d, 10, 64)
	if err != nil || ns < 0 {
		return 0, "", fmt.Errorf("keys: %q: deadline %q is not decimal", key, d)
	}
	return ns, order, nil
}

// Archive is the record of sku's pruned (archived) orders.
func (s Space) Archive(sku string) string { return s.prefix + "archive/" + sku }

// Users is the prefix of sku's per-user counters.
func (s Space) Users(sku string) string { return s.prefix + "users/" + sku + "/" }

// User is the counter of the units buyer holds of sku.
func (s Space) User(sku, buyer string) string { return s.Users(sku) + buyer }

// ParseUser returns the buyer of a key under Users(sku).
func (s Space) ParseUser(sku, key string) (string, error) {
	b, ok := strings.CutPrefix(key, s.Users(sku))
	if !ok || b == "" || strings.Contains(b, "/") {
		return "", fmt.Errorf("keys: %q is not a user key of %q", key, sku)
	}
	return b, nil
}

// Deliveries is the prefix of sku's delivery (restock) records.
func (s Space) Deliveries(sku string) string { return s.prefix + "deliveries/" + sku + "/" }

// Delivery is the record of delivery id of sku.
func (s Space) Delivery(sku, id string) string { return s.Deliveries(sku) + id }

// DeliveryID is the global claim of delivery id: delivery IDs are unique
// across SKUs, as order IDs are.
func (s Space) DeliveryID(id string) string { return s.prefix + "deliveryid/" + id }

// ParseDelivery returns the delivery ID of a key under Deliveries(sku).
func (s Space) ParseDelivery(sku, key string) (string, error) {
	id, ok := strings.CutPrefix(key, s.Deliveries(sku))
	if !ok || id == "" || strings.Contains(id, "/") {
		return "", fmt.Errorf("keys: %q is not a delivery key of %q", key, sku)
	}
	return id, nil
}

func index(i int) string {
	if i < 0 || i > maxIndex {
		// Callers validate indices against the SKU's segment count first; a
		// bad index here is a programming error, and a wrong key would be worse.
		panic(fmt.Sprintf("keys: segment index %d out of range", i))
	}
	s := strconv.Itoa(i)
	return strings.Repeat("0", SegmentDigits-len(s)) + s
}

// Kind says what a parsed stock key is.
type Kind int

// Kinds of stock keys.
const (
	KindPool Kind = iota + 1
	KindSegment
	KindInbox
)

func (k Kind) String() string {
	switch k {
	case KindPool:
		return "pool"
	case KindSegment:
		return "segment"
	case KindInbox:
		return "inbox"
	}
	return "unknown"
}

// StockKey is a parsed stock counter key.
type StockKey struct {
	SKU   string
	Kind  Kind
	Index int // segment index for KindSegment and KindInbox; -1 for the pool
}

// ParseStock parses a key under StockPrefix, as delivered by a watch.
func (s Space) ParseStock(key string) (StockKey, error) {
	rest, ok := strings.CutPrefix(key, s.StockPrefix())
	if !ok {
		return StockKey{}, fmt.Errorf("keys: %q is not under %q", key, s.StockPrefix())
	}
	sku, tail, ok := strings.Cut(rest, "/")
	if !ok || sku == "" {
		return StockKey{}, fmt.Errorf("keys: %q has no SKU", key)
	}
	if tail == "pool" {
		return StockKey{SKU: sku, Kind: KindPool, Index: -1}, nil
	}
	kindName, idx, ok := strings.Cut(tail, "/")
	if !ok {
		return StockKey{}, fmt.Errorf("keys: %q is not a stock counter", key)
	}
	var kind Kind
	switch kindName {
	case "seg":
		kind = KindSegment
	case "in":
		kind = KindInbox
	default:
		return StockKey{}, fmt.Errorf("keys: %q is not a stock counter", key)
	}
	i, err := parseIndex(idx)
	if err != nil {
		return StockKey{}, fmt.Errorf("keys: %q: %w", key, err)
	}
	return StockKey{SKU: sku, Kind: kind, Index: i}, nil
}

// StockLocks is the prefix of every lock key of sku's places (the pool and
// the segments).
func (s Space) StockLocks(sku string) string { return s.prefix + "stocklocks/" + sku + "/" }

// StockLocksPrefix is the prefix of every SKU's place locks (one watch of
// it sees every segment lock of the prefix).
func (s Space) StockLocksPrefix() string { return s.prefix + "stocklocks/" }

// StockLockKey is a parsed waiter key of a place's lock.
type StockLockKey struct {
	SKU   string
	Kind  Kind  // KindPool or KindSegment
	Index int   // segment index; -1 for the pool
	Lease int64 // the lease of the session that put the key
}

// ParseStockLock parses a waiter key under StockLocks(sku), as delivered
// by a watch: P stocklocks/<sku>/pool/<lease> or
// P stocklocks/<sku>/seg/<iiii>/<lease>, the lease in hexadecimal.
func (s Space) ParseStockLock(key string) (StockLockKey, error) {
	rest, ok := strings.CutPrefix(key, s.prefix+"stocklocks/")
	if !ok {
		return StockLockKey{}, fmt.Errorf("keys: %q is not under %q", key, s.prefix+"stocklocks/")
	}
	sku, tail, ok := strings.Cut(rest, "/")
	if !ok || sku == "" {
		return StockLockKey{}, fmt.Errorf("keys: %q has no SKU", key)
	}
	k := StockLockKey{SKU: sku, Index: -1}
	var lease string
	if l, ok := strings.CutPrefix(tail, "pool/"); ok {
		k.Kind, lease = KindPool, l
	} else if l, ok := strings.CutPrefix(tail, "seg/"); ok {
		idx, l, ok := strings.Cut(l, "/")
		if !ok {
			return StockLockKey{}, fmt.Errorf("keys: %q is not a lock key", key)
		}
		i, err := parseIndex(idx)
		if err != nil {
			return StockLockKey{}, fmt.Errorf("keys: %q: %w", key, err)
		}
		k.Kind, k.Index, lease = KindSegment, i, l
	} else {
		return StockLockKey{}, fmt.Errorf("keys: %q is not a lock key", key)
	}
	// Sessions write their lease as strconv.FormatInt(id, 16): one spelling.
	id, err := strconv.ParseInt(lease, 16, 64)
	if err != nil || id <= 0 || strconv.FormatInt(id, 16) != lease {
		return StockLockKey{}, fmt.Errorf("keys: %q: lease %q is not hexadecimal", key, lease)
	}
	k.Lease = id
	return k, nil
}

// ParseMeta returns the SKU of a key under MetaPrefix.
func (s Space) ParseMeta(key string) (string, error) {
	sku, ok := strings.CutPrefix(key, s.MetaPrefix())
	if !ok || sku == "" || strings.Contains(sku, "/") {
		return "", fmt.Errorf("keys: %q is not a meta key under %q", key, s.MetaPrefix())
	}
	return sku, nil
}

// ParseOrder returns the order ID of a key under Orders(sku).
func (s Space) ParseOrder(sku, key string) (string, error) {
	id, ok := strings.CutPrefix(key, s.Orders(sku))
	if !ok || id == "" || strings.Contains(id, "/") {
		return "", fmt.Errorf("keys: %q is not an order key of %q", key, sku)
	}
	return id, nil
}

func parseIndex(s string) (int, error) {
	if len(s) != SegmentDigits {
		return 0, fmt.Errorf("segment index %q is not %d digits", s, SegmentDigits)
	}
	n := 0
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, fmt.Errorf("segment index %q is not decimal", s)
		}
		n = n*10 + int(s[i]-'0')
	}
	return n, nil
}
