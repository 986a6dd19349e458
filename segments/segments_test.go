package segments

import (
	"errors"
	"strings"
	"testing"
	"time"
)

func TestRouteIsStable(t *testing.T) {
	// The routing function is part of the format: these values must never change.
	cases := []struct {
		key  string
		n    int
		want int
	}{
		{"user-1", 20, Route("user-1", 20)},
		{"", 7, int(14695981039346656037 % 7)}, // FNV-1a offset basis
		{"a", 1, 0},
	}
	for _, tc := range cases {
		if got := Route(tc.key, tc.n); got != tc.want {
			t.Errorf("Route(%q, %d) = %d, want %d", tc.key, tc.n, got, tc.want)
		}
	}
	// FNV-1a 64 of "a" is 0xaf63dc4c8601ec8c.
	if got, want := Route("a", 1000), int(uint64(0xaf63dc4c8601ec8c)%1000); got != want {
		t.Errorf("Route(a, 1000) = %d, want %d", got, want)
	}
}

func TestRouteSpreads(t *testing.T) {
	const n, keys = 20, 20000
	counts := make([]int, n)
	for i := 0; i < keys; i++ {
		counts[Route("user-"+itoa(i), n)]++
	}
	for i, c := range counts {
		if c < keys/n*8/10 || c > keys/n*12/10 {
			t.Errorf("segment %d got %d of %d keys: routing is skewed", i, c, keys)
		}
	}
}

func itoa(i int) string {
	if i == 0 {
		return "0"
	}
	var b []byte
	for ; i > 0; i /= 10 {
		b = append([]byte{byte('0' + i%10)}, b...)
	}
	return string(b)
}

// FuzzRoute: always in range, and deterministic.
func FuzzRoute(f *testing.F) {
	f.Add("user-1", 20)
	f.Add("", 1)
	f.Add("\xff\x00", 1024)
	f.Fuzz(func(t *testing.T, key string, n int) {
		if n < 1 || n > MaxSegments {
			return
		}
		r := Route(key, n)
		if r < 0 || r >= n || r != Route(key, n) {
			t.Fatalf("Route(%q, %d) = %d", key, n, r)
		}
	})
}

func TestValidate(t *testing.T) {
	bad := []struct {
		field string
		err   error
	}{
		{"sku", ValidateSKU("")},
		{"sku", ValidateSKU("a/b")},
		{"sku", ValidateSKU("..")},
		{"sku", ValidateSKU(strings.Repeat("a", MaxSKULen+1))},
		{"sku", ValidateSKU("é")},
		{"order", ValidateOrderID("")},
		{"order", ValidateOrderID("a b")},
		{"order", ValidateOrderID("a/b")},
		{"order", ValidateOrderID(strings.Repeat("o", MaxOrderIDLen+1))},
		{"qty", ValidateQty(0)},
		{"qty", ValidateQty(MaxQty + 1)},
		{"route key", ValidateRouteKey(strings.Repeat("r", MaxRouteKeyLen+1))},
	}
	for _, tc := range bad {
		var inv *InvalidError
		if !errors.As(tc.err, &inv) || !errors.Is(tc.err, ErrInvalid) || inv.Field != tc.field {
			t.Errorf("%v: want an InvalidError for field %q", tc.err, tc.field)
		}
	}
	for _, err := range []error{ValidateSKU("iPhone-16_pro.max"), ValidateOrderID("2026-11-22:o#1"), ValidateQty(1), ValidateRouteKey("")} {
		if err != nil {
			t.Errorf("valid input rejected: %v", err)
		}
	}
}

func TestCounterEncoding(t *testing.T) {
	for _, n := range []int64{0, 1, 42, MaxTotal} {
		got, err := DecodeCounter("k", []byte(EncodeCounter(n)))
		if err != nil || got != n {
			t.Errorf("round trip of %d: %d, %v", n, got, err)
		}
	}
	for _, v := range []string{"", "5", `{"v":1,"n":-1}`, `{"v":2,"n":1}`, `{"n":1,"v":1}`, `{"v":1,"n":01}`,
		`{"v":1, "n":1}`, `{"v":1,"n":1}x`, `{"v":1,"n":1000000000000000001}`, `{"v":1,"n":99999999999999999999}`} {
		_, err := DecodeCounter("/k", []byte(v))
		var ce *CorruptError
		if !errors.As(err, &ce) || ce.Key != "/k" || !errors.Is(err, ErrCorrupt) {
			t.Errorf("DecodeCounter(%q) = %v, want a CorruptError naming the key", v, err)
		}
	}
}

// FuzzDecodeCounter: never panics; whatever decodes re-encodes to the same bytes.
func FuzzDecodeCounter(f *testing.F) {
	f.Add([]byte(EncodeCounter(7)))
	f.Add([]byte(`{"v":1,"n":}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		n, err := DecodeCounter("k", b)
		if err == nil && EncodeCounter(n) != string(b) {
			t.Fatalf("%q decoded to %d which encodes as %q", b, n, EncodeCounter(n))
		}
	})
}

func TestOrderAndMetaEncoding(t *testing.T) {
	o := Order{SKU: "s", ID: "o", Qty: 3, Parts: []Part{{Place: Pool, Qty: 1}, {Place: Segment(4), Qty: 2}}, Created: time.Unix(1, 0).UTC()}
	got, err := DecodeOrder("k", []byte(EncodeOrder(o)))
	if err != nil || got.Qty != 3 || len(got.Parts) != 2 || got.Parts[1].Place != Segment(4) || got.V != Version {
		t.Fatalf("order round trip: %+v %v", got, err)
	}
	bad := []string{
		`{"v":1,"sku":"s","order":"o","qty":3,"parts":[{"from":"pool","qty":1}],"created":"1970-01-01T00:00:01Z"}`,       // parts ≠ qty
		`{"v":1,"sku":"s","order":"o","qty":1,"parts":[{"from":"seg/01","qty":1}],"created":"1970-01-01T00:00:01Z"}`,     // bad place
		`{"v":1,"sku":"s","order":"o","qty":1,"parts":[{"from":"pool","qty":1}],"created":"1970-01-01T00:00:01Z","x":1}`, // unknown field
		`{"v":3,"sku":"s","order":"o","qty":1,"parts":[{"from":"pool","qty":1}],"created":"1970-01-01T00:00:01Z"}`,       // version
	}
	for _, v := range bad {
		if _, err := DecodeOrder("k", []byte(v)); !errors.Is(err, ErrCorrupt) {
			t.Errorf("DecodeOrder(%s) = %v, want corrupt", v, err)
		}
	}
	m := Meta{Total: 10, Segments: 2, RefillBatch: 1}
	if got, err := DecodeMeta("k", []byte(EncodeMeta(m))); err != nil || got.Total != 10 {
		t.Fatalf("meta round trip: %+v %v", got, err)
	}
	if _, err := DecodeMeta("k", []byte(`{"v":1,"total":10,"segments":0,"lowWatermark":0,"refillBatch":1,"created":"1970-01-01T00:00:01Z"}`)); !errors.Is(err, ErrCorrupt) {
		t.Error("meta with 0 segments accepted")
	}
}

// FuzzPlace: UnmarshalText accepts exactly what MarshalText produces.
func FuzzPlace(f *testing.F) {
	f.Add("pool")
	f.Add("seg/0")
	f.Add("seg/1023")
	f.Add("seg/01")
	f.Fuzz(func(t *testing.T, s string) {
		var p Place
		if err := p.UnmarshalText([]byte(s)); err != nil {
			return
		}
		b, err := p.MarshalText()
		if err != nil || string(b) != s {
			t.Fatalf("%q parsed to %d, which marshals as %q", s, p, b)
		}
	})
}

// A name with a character outside what it allows is refused with the
// character quoted as UTF-8, not its first byte alone ('é', not 'Ã').
func TestValidationQuotesUTF8(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want string
	}{
		{ValidateSKU("téléphone"), `byte 1 (the first of 2 bytes of 'é', U+00E9)`},
		{ValidateOrderID("Îd"), `byte 0 (the first of 2 bytes of 'Î', U+00CE)`},
		{ValidateBuyer("bob\x00"), `byte 3 ('\x00')`},
		{ValidateOrderID("a\xffb"), `byte 1 (0xff)`},
	} {
		if tc.err == nil || !strings.Contains(tc.err.Error(), tc.want) {
			t.Errorf("%v: want it to say %s", tc.err, tc.want)
		}
	}
}
