package service

import (
	"fmt"
	"unicode/utf8"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	stockctlv1 "github.com/stockctl/stockctl/api/stockctl/v1"
)

// asciiFields are the request fields whose values become etcd keys or
// names (SKUs, order, buyer and delivery IDs, lock names, request IDs):
// ASCII only, as the coordinator checks. Unicode SKUs such as "téléphone"
// are not allowed: they would be keys, metric labels and file names in
// every tool; a display name belongs in the caller's catalogue.
var asciiFields = map[protoreflect.Name]string{
	"sku":        "a SKU is ASCII letters, digits, '.', '_' and '-'",
	"order":      "an order ID is printable ASCII other than space and '/'",
	"buyer":      "a buyer is printable ASCII other than space and '/'",
	"delivery":   "a delivery ID is printable ASCII other than space and '/'",
	"name":       "a lock name is printable ASCII other than space and '/'",
	"request_id": "a request_id is printable ASCII other than space",
}

// checkASCII refuses a non-ASCII value in m's asciiFields (top level)
// with an error that quotes the value and the character as UTF-8: the
// coordinator's own check names a byte, which shows as mojibake ('Ã' for
// the first byte of 'é').
func checkASCII(m proto.Message) error {
	// The orders' requests first, without reflection (a fifth of an
	// OrderStream order's handling in a serve process's profile): when
	// every string field is ASCII there is nothing to refuse; otherwise
	// the reflective walk below says which field and character.
	switch r := m.(type) {
	case nil:
		return nil
	case *stockctlv1.AllocateRequest:
		if r == nil || allASCII(r.Sku, r.Order, r.RouteKey, r.Buyer) {
			return nil
		}
	case *stockctlv1.ReserveRequest:
		if r == nil || allASCII(r.Sku, r.Order, r.RouteKey, r.Buyer) {
			return nil
		}
	}
	var err error
	r := m.ProtoReflect()
	r.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		allowed, ok := asciiFields[fd.Name()]
		if !ok || fd.Kind() != protoreflect.StringKind || fd.IsList() {
			return true
		}
		err = asciiValue(string(fd.Name()), v.String(), allowed)
		return err == nil
	})
	return err
}

// allASCII reports whether every byte of vs is ASCII.
func allASCII(vs ...string) bool {
	for _, v := range vs {
		for i := 0; i < len(v); i++ {
			if v[i] >= utf8.RuneSelf {
				return false
			}
		}
	}
	return true
}

func asciiValue(field, v, allowed string) error {
	for i, c := range v {
		if c < utf8.RuneSelf {
			continue
		}
		if _, size := utf8.DecodeRuneInString(v[i:]); c == utf8.RuneError && size <= 1 {
			return badField(field, fmt.Sprintf("%q is not valid UTF-8 (byte %d is %#02x): %s", v, i, v[i], allowed))
		}
		return badField(field, fmt.Sprintf("%q has the non-ASCII character %q (U+%04X) at byte %d: %s", v, c, c, i, allowed))
	}
	return nil
}
