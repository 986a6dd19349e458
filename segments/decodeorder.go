package segments

import "time"

// Reading order records without reflection. Audit, AuditAt, Status of a
// lazy segment, prune and every release decode records by the thousand,
// and encoding/json's strict decoder was most of their CPU (a quarter of
// a 4-process sale test's under -race, where the audits run beside the
// sale). decodeOrderFast reads exactly what EncodeOrder's fast path
// writes (appendOrder: its fields in its order, strings that need no
// escape), and declines anything else, which DecodeOrder then leaves to
// encoding/json. For every input it accepts it gives what encoding/json
// gives (FuzzDecodeOrder compares the two).
//
// Meta records likewise (decodeMetaFast, FuzzDecodeMeta): every process's
// first order reads every SKU's meta record (Engine.prefetchMetas), and so
// does a rebalancer taking the lead; over 10,000 SKUs their decoding was
// 5 % of the CPU of a 3-second sale's window.

// orderReader is a cursor over a record.
type orderReader struct {
	b  []byte
	ok bool
}

// lit consumes s if the input continues with it.
func (r *orderReader) lit(s string) bool {
	if r.ok && len(r.b) >= len(s) && string(r.b[:len(s)]) == s {
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

// quoted consumes a string token and returns it, quotes included, if its
// characters are printable ASCII without a backslash, which JSON reads as
// they are.
func (r *orderReader) quoted() []byte {
	if !r.ok || len(r.b) == 0 || r.b[0] != '"' {
		r.ok = false
		return nil
	}
	for i := 1; i < len(r.b); i++ {
		switch c := r.b[i]; {
		case c == '"':
			tok := r.b[:i+1]
			r.b = r.b[i+1:]
			return tok
		case c < 0x20 || c > 0x7e || c == '\\':
			r.ok = false
			return nil
		}
	}
	r.ok = false
	return nil
}

// str consumes a string token (quoted) and returns its characters.
func (r *orderReader) str() string {
	if tok := r.quoted(); r.ok {
		return string(tok[1 : len(tok)-1])
	}
	return ""
}

// num consumes an integer in canonical form (a sign if negative, no
// leading zero, no fraction or exponent), as appendOrder writes it.
func (r *orderReader) num() int64 {
	if !r.ok {
		return 0
	}
	neg := len(r.b) > 0 && r.b[0] == '-'
	i := 0
	if neg {
		i++
	}
	digits := i
	var n uint64
	for ; i < len(r.b) && r.b[i] >= '0' && r.b[i] <= '9'; i++ {
		d := uint64(r.b[i] - '0')
		if n > (1<<63)/10 || n*10+d > 1<<63 {
			r.ok = false // beyond int64
			return 0
		}
		n = n*10 + d
	}
	if k := i - digits; k == 0 || (k > 1 && r.b[digits] == '0') || (n == 1<<63 && !neg) {
		r.ok = false
		return 0
	}
	r.b = r.b[i:]
	if neg {
		return -int64(n) // -1<<63 included: its negation wraps to itself
	}
	return int64(n)
}

// at consumes a time's string token, read as time.Time.UnmarshalJSON
// reads it (what encoding/json calls).
func (r *orderReader) at() time.Time {
	var t time.Time
	if tok := r.quoted(); !r.ok || t.UnmarshalJSON(tok) != nil {
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
	r.must(`,"sku":`)
	o.SKU = r.str()
	r.must(`,"order":`)
	o.ID = r.str()
	if r.lit(`,"qty":`) {
		o.Qty = r.num()
	}
	if r.lit(`,"parts":[`) {
		for r.ok { // at least one part: appendOrder writes no empty list
			r.must(`{"from":`)
			place := r.quoted()
			r.must(`,"qty":`)
			qty := r.num()
			r.must("}")
			var p Place
			if !r.ok || p.UnmarshalText(place[1:len(place)-1]) != nil {
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
	if r.lit(`,"created":`) {
		o.Created = r.at()
	}
	if r.lit(`,"state":`) {
		o.State = OrderState(r.str())
	}
	if r.lit(`,"deadline":`) {
		o.Deadline = r.at()
	}
	if r.lit(`,"buyer":`) {
		o.Buyer = r.str()
	}
	o.UserCounted = r.lit(`,"userCounted":true`)
	r.must("}")
	if !r.ok || len(r.b) != 0 {
		return Order{}, false
	}
	return o, true
}

// decodeMetaFast decodes value if it is in the form EncodeMeta writes (its
// fields in Meta's order, the omitted ones left out); ok is false for
// anything else (not necessarily invalid: encoding/json decides).
func decodeMetaFast(value []byte) (m Meta, ok bool) {
	r := &orderReader{b: value, ok: true}
	r.must(`{"v":`)
	v := r.num()
	r.must(`,"total":`)
	m.Total = r.num()
	r.must(`,"segments":`)
	segs := r.num()
	r.must(`,"lowWatermark":`)
	m.LowWatermark = r.num()
	r.must(`,"refillBatch":`)
	m.RefillBatch = r.num()
	if r.lit(`,"perUserLimit":`) {
		m.PerUserLimit = r.num()
	}
	m.Creating = r.lit(`,"creating":true`)
	if r.lit(`,"initialFill":`) {
		m.InitialFill = r.num()
	}
	r.must(`,"created":`)
	m.Created = r.at()
	r.must("}")
	// v and segments are ints: a value an int cannot hold is encoding/json's
	// to refuse.
	if !r.ok || len(r.b) != 0 || int64(int(v)) != v || int64(int(segs)) != segs {
		return Meta{}, false
	}
	m.V, m.Segments = int(v), int(segs)
	return m, true
}
