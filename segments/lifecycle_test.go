package segments

import (
	"errors"
	"strings"
	"testing"
	"time"
)

// Order records of the reservation lifecycle: an old record (no state)
// decodes as an active plain allocation; a reservation round-trips with its
// deadline to the nanosecond (its index key is built from it); malformed
// states are corrupt.
func TestOrderLifecycleEncoding(t *testing.T) {
	old := `{"v":1,"sku":"s","order":"o","qty":1,"parts":[{"from":"pool","qty":1}],"created":"1970-01-01T00:00:01Z"}`
	o, err := DecodeOrder("k", []byte(old))
	if err != nil || o.State != "" || !o.Active() || o.Reserved() || !o.Deadline.IsZero() || o.Buyer != "" {
		t.Fatalf("old record: %+v %v", o, err)
	}
	d := time.Date(2026, 11, 23, 12, 0, 0, 123456789, time.UTC)
	r := Order{SKU: "s", ID: "o", Qty: 2, Parts: []Part{{Place: Segment(1), Qty: 2}}, Created: d,
		State: StateReserved, Deadline: d.Add(time.Minute), Buyer: "amy", UserCounted: true}
	got, err := DecodeOrder("k", []byte(EncodeOrder(r)))
	if err != nil || !got.Reserved() || got.Deadline.UnixNano() != r.Deadline.UnixNano() || got.Buyer != "amy" || !got.UserCounted {
		t.Fatalf("reservation round trip: %+v %v", got, err)
	}
	r.State = StateExpired
	if got, _ := DecodeOrder("k", []byte(EncodeOrder(r))); got.Active() || got.Reserved() {
		t.Fatalf("an expired reservation is active: %+v", got)
	}
	if enc := EncodeOrder(Order{SKU: "s", ID: "o", Qty: 1, Parts: []Part{{Place: Pool, Qty: 1}}}); strings.Contains(enc, "deadline") || strings.Contains(enc, "state") {
		t.Fatalf("a plain allocation's record carries lifecycle fields: %s", enc)
	}
	bad := []string{
		`{"v":1,"sku":"s","order":"o","qty":1,"parts":[{"from":"pool","qty":1}],"created":"1970-01-01T00:00:01Z","state":"paid","deadline":"1970-01-01T00:00:02Z"}`,
		`{"v":1,"sku":"s","order":"o","qty":1,"parts":[{"from":"pool","qty":1}],"created":"1970-01-01T00:00:01Z","state":"reserved"}`,
		`{"v":1,"sku":"s","order":"o","qty":1,"parts":[{"from":"pool","qty":1}],"created":"1970-01-01T00:00:01Z","deadline":"1970-01-01T00:00:02Z"}`,
		`{"v":1,"sku":"s","order":"o","qty":1,"parts":[{"from":"pool","qty":1}],"created":"1970-01-01T00:00:01Z","userCounted":true}`,
		`{"v":1,"sku":"s","order":"o","qty":1,"parts":[{"from":"pool","qty":1}],"created":"1970-01-01T00:00:01Z","buyer":"a/b"}`,
	}
	for _, v := range bad {
		if _, err := DecodeOrder("k", []byte(v)); !errors.Is(err, ErrCorrupt) {
			t.Errorf("DecodeOrder(%s) = %v, want corrupt", v, err)
		}
	}
}

func TestValidateBuyerAndTTL(t *testing.T) {
	for _, b := range []string{"", "a b", "a/b", strings.Repeat("x", MaxBuyerLen+1), "é"} {
		if !errors.Is(ValidateBuyer(b), ErrInvalid) {
			t.Errorf("ValidateBuyer(%q) accepted", b)
		}
	}
	if err := ValidateBuyer("user-42"); err != nil {
		t.Error(err)
	}
	for _, d := range []time.Duration{0, -time.Second, MaxReservationTTL + 1, 1 << 62} {
		if !errors.Is(ValidateTTL(d), ErrInvalid) {
			t.Errorf("ValidateTTL(%v) accepted", d)
		}
	}
	for _, d := range []time.Duration{1, time.Second, MaxReservationTTL} {
		if err := ValidateTTL(d); err != nil {
			t.Error(err)
		}
	}
}
