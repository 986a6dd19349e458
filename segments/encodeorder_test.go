package segments

import (
	"encoding/json"
	"testing"
	"time"
)

// EncodeOrder writes what json.Marshal writes, byte for byte, whatever the
// order: the fast path (appendOrder) for plain orders and reservations,
// encoding/json for the rest. Run with -fuzz to search further; the seeds
// run in every `go test`.
func FuzzEncodeOrder(f *testing.F) {
	t0 := time.Date(2026, 11, 26, 17, 9, 41, 123456789, time.UTC)
	seeds := []struct {
		sku, id, buyer, state string
		qty                   int64
		from1, from2          int
		created, deadline     int64
		zone                  int
		released, counted     bool
		lines                 bool
	}{
		{"tee", "o-1", "", "", 1, 3, -2, t0.UnixNano(), 0, 0, false, false, false},                              // plain, one part
		{"tee", "o-2", "u-7", "reserved", 5, -1, 0, t0.UnixNano(), t0.UnixNano() + 9e11, 0, false, true, false}, // pool and seg 0, a reservation
		{"tee", "o-3", "", "confirmed", 2, 19, 4, t0.Truncate(time.Second).UnixNano(), 0, 0, true, false, false},
		{"t<e>e&", "o\"4\\", "b\u00e9", "", 1, 0, -2, t0.UnixNano(), 0, 0, false, false, false}, // escaped: encoding/json
		{"tee", "o-5", "", "", 0, -2, -2, 0, 0, 0, false, false, false},                         // no qty, no parts, no time
		{"tee", "o-6", "", "", 1, 1, -2, t0.UnixNano(), 0, 5*3600 + 30*60, false, false, false}, // an offset
		{"tee", "o-7", "", "", 1, 1, -2, t0.UnixNano(), 0, 3600 + 7, false, false, false},       // an offset with seconds
		{"tee", "o-8", "", "", 2, 1, 2, t0.UnixNano(), 0, 0, false, false, true},                // several lines
		{"tee", "o-9\x7f", "", "", 1, 1, -2, t0.UnixNano(), 0, 0, false, false, false},          // DEL
	}
	for _, s := range seeds {
		f.Add(s.sku, s.id, s.buyer, s.state, s.qty, s.from1, s.from2, s.created, s.deadline, s.zone, s.released, s.counted, s.lines)
	}
	f.Fuzz(func(t *testing.T, sku, id, buyer, state string, qty int64, from1, from2 int, created, deadline int64, zone int,
		released, counted, lines bool) {
		loc := time.FixedZone("z", zone%(30*3600))
		at := func(ns int64) time.Time {
			if ns == 0 {
				return time.Time{}
			}
			return time.Unix(0, ns).In(loc)
		}
		o := Order{SKU: sku, ID: id, Qty: qty, Released: released, Created: at(created), State: OrderState(state),
			Deadline: at(deadline), Buyer: buyer, UserCounted: counted}
		for _, from := range []int{from1, from2} {
			if from >= -1 { // -1 is the pool; below it, no part
				o.Parts = append(o.Parts, Part{Place: Place(from), Qty: 1})
			}
		}
		if lines {
			o.Lines = []string{sku, "other"}
		}
		o.V = Version
		want, err := json.Marshal(o)
		if err != nil {
			t.Skip("json.Marshal refuses it too:", err)
		}
		if got := EncodeOrder(o); got != string(want) {
			t.Fatalf("EncodeOrder(%+v)\n got %s\nwant %s", o, got, want)
		}
		if _, ok := appendOrder(nil, &o); ok && (lines || !plainJSON(sku) || !plainJSON(id)) {
			t.Fatalf("the fast path took an order it must leave to encoding/json: %+v", o)
		}
		// What the fast path writes, the fast path reads back.
		if enc, ok := appendOrder(nil, &o); ok {
			if _, fast := decodeOrderFast(enc); !fast {
				t.Fatalf("decodeOrderFast declined what appendOrder wrote: %s", enc)
			}
		}
	})
}

// A plain order and a reservation take the fast path (FuzzEncodeOrder
// checks its bytes): otherwise that test would compare encoding/json with
// itself.
func TestEncodeOrderFastPath(t *testing.T) {
	for _, o := range fastPathOrders() {
		if _, ok := appendOrder(nil, &o); !ok {
			t.Errorf("%s: not encoded by appendOrder", o.ID)
		}
	}
}

// fastPathOrders are orders both fast paths take (appendOrder,
// decodeOrderFast): a plain order, a reservation, a released order.
func fastPathOrders() []Order {
	at := time.Date(2026, 11, 26, 17, 9, 41, 5, time.UTC)
	return []Order{
		{V: Version, SKU: "tee", ID: "o-1", Qty: 1, Parts: []Part{{Place: Segment(3), Qty: 1}}, Created: at},
		{V: Version, SKU: "tee", ID: "o-2", Qty: 2, Parts: []Part{{Place: Pool, Qty: 1}, {Place: Segment(0), Qty: 1}}, Created: at,
			State: StateReserved, Deadline: at.Add(time.Minute), Buyer: "u-1", UserCounted: true},
		{V: Version, SKU: "tee", ID: "o-3", Qty: 1, Parts: []Part{{Place: Segment(3), Qty: 1}}, Released: true, Created: at},
	}
}
