package segments

import (
	"bytes"
	"strconv"
	"time"
)

// Reading order records without reflection. Audit, AuditAt, Status of a
// lazy segment, prune and every release decode records by the thousand,
// and encoding/json's strict decoder was most of their CPU (a quarter of
// a 4-process sale test's under -race, where the audits run beside the
// sale). decodeOrderFast reads exactly what EncodeOrder's fast path
// writes (appendOrder: its fields in its order, strings that need no
// escape), and declines anything else, which DecodeOrder then leaves to
// encoding/json. For every input it accepts it gives what encoding/json
// gives (FuzzDecodeOrder compares the two).

// orderReader is a cursor over a record.
type orderReader struct {
	b  []byte
	ok bool
}

// lit consumes s if the input continues with it.
func (r *orderReader) lit(s string) bool {
	if r.ok && bytes.HasPrefix(r.b, []byte(s)) {
		r.b = r.b[len(s):]
		return true
	}
	return false
}

// must consumes s, or fails the read.
func (r *orderReader) must(s string) {
	if !r.lit(s) {
		r.ok = false
	}
}

// str consumes a string's characters up to its closing quote (consumed
// too): printable ASCII without a backslash, which JSON reads as is.
func (r *orderReader) str() string {
	if !r.ok {
		return ""
	}
	for i := 0; i < len(r.b); i++ {
		switch c := r.b[i]; {
		case c == '"':
			s := string(r.b[:i])
			r.b = r.b[i+1:]
			return s
		case c < 0x20 || c > 0x7e || c == '\\':
			r.ok = false
			return ""
		}
	}
	r.ok = false
	return ""
}

// num consumes an integer in canonical form (a sign if negative, no
// leading zero, no fraction or exponent), as appendOrder writes it.
func (r *orderReader) num() int64 {
	if !r.ok {
		return 0
	}
	i := 0
	if len(r.b) > 0 && r.b[0] == '-' {
		i++
	}
	digits := i
	for i < len(r.b) && r.b[i] >= '0' && r.b[i] <= '9' {
		i++
	}
	if n := i - digits; n == 0 || n > 19 || (n > 1 && r.b[digits] == '0') {
		r.ok = false
		return 0
	}
	n, err := strconv.ParseInt(string(r.b[:i]), 10, 64)
	if err != nil {
		r.ok = false
		return 0
	}
	r.b = r.b[i:]
	return n
}

// at consumes a time's characters and closing quote, read as
// time.Time.UnmarshalJSON reads it (what encoding/json calls).
func (r *orderReader) at() time.Time {
	s := r.str()
	if !r.ok {
		return time.Time{}
	}
	var t time.Time
	quoted := make([]byte, 0, len(s)+2)
	quoted = append(append(append(quoted, '"'), s...), '"')
	if err := t.UnmarshalJSON(quoted); err != nil {
		r.ok = false
	}
	return t
}

// decodeOrderFast decodes value if it is in the form appendOrder writes;
// ok is false for anything else (not necessarily invalid: encoding/json
// decides).
func decodeOrderFast(value []byte) (o Order, ok bool) {
	r := &orderReader{b: value, ok: true}
	r.must(`{"v":`)
	o.V = int(r.num())
	r.must(`,"sku":"`)
	o.SKU = r.str()
	r.must(`,"order":"`)
	o.ID = r.str()
	if r.lit(`,"qty":`) {
		o.Qty = r.num()
	}
	if r.lit(`,"parts":[`) {
		for r.ok { // at least one part: appendOrder writes no empty list
			r.must(`{"from":"`)
			place := r.str()
			r.must(`,"qty":`)
			qty := r.num()
			r.must("}")
			var p Place
			if !r.ok || p.UnmarshalText([]byte(place)) != nil {
				return Order{}, false
			}
			o.Parts = append(o.Parts, Part{Place: p, Qty: qty})
			if r.lit("]") {
				break
			}
			r.must(",")
		}
	}
	o.Released = r.lit(`,"released":true`)
	if r.lit(`,"created":"`) {
		o.Created = r.at()
	}
	if r.lit(`,"state":"`) {
		o.State = OrderState(r.str())
	}
	if r.lit(`,"deadline":"`) {
		o.Deadline = r.at()
	}
	if r.lit(`,"buyer":"`) {
		o.Buyer = r.str()
	}
	o.UserCounted = r.lit(`,"userCounted":true`)
	r.must("}")
	if !r.ok || len(r.b) != 0 {
		return Order{}, false
	}
	return o, true
}
