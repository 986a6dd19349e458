package segments

import (
	"errors"
	"fmt"
	"strconv"
	"time"
	"unicode/utf8"
)

// Limits on inputs. They keep every sum of counters far from int64 overflow:
// MaxTotal × (MaxSegments + 2) < 2^63.
const (
	// MaxSegments is the largest segment count of a SKU.
	MaxSegments = 1024
	// MaxTotal is the largest stock a SKU can hold in total (initial stock
	// plus every restock).
	MaxTotal int64 = 1_000_000_000_000_000
	// MaxQty is the largest quantity of one allocation or restock.
	MaxQty int64 = 1_000_000_000
	// MaxSKULen is the longest SKU name, in bytes.
	MaxSKULen = 64
	// MaxOrderIDLen is the longest order ID, in bytes.
	MaxOrderIDLen = 128
	// MaxRouteKeyLen is the longest route key, in bytes.
	MaxRouteKeyLen = 1024
	// MaxBuyerLen is the longest buyer ID, in bytes.
	MaxBuyerLen = 128
	// MaxReservationTTL is the longest a reservation may wait for its
	// Confirm. A day covers every checkout window in use (JD: 30 min,
	// Stripe: up to 24 h); beyond it, a reservation is stock held hostage.
	MaxReservationTTL = 24 * time.Hour
)

// ErrInvalid is the sentinel of every validation error (errors.Is).
var ErrInvalid = errors.New("invalid argument")

// InvalidError says which input field was wrong and why.
type InvalidError struct {
	Field  string // e.g. "sku", "qty", "order"
	Value  string // the offending value, quoted for printing
	Reason string
}

func (e *InvalidError) Error() string {
	return fmt.Sprintf("invalid %s %s: %s", e.Field, e.Value, e.Reason)
}

// Unwrap makes errors.Is(err, ErrInvalid) true.
func (e *InvalidError) Unwrap() error { return ErrInvalid }

func invalid(field string, value any, format string, args ...any) error {
	v := fmt.Sprint(value)
	if s, ok := value.(string); ok {
		v = fmt.Sprintf("%q", s)
	}
	return &InvalidError{Field: field, Value: v, Reason: fmt.Sprintf(format, args...)}
}

// ValidateSKU checks a SKU name: 1 to MaxSKULen bytes of ASCII letters,
// digits, '.', '_' and '-', and not "." or "..". The charset keeps SKUs safe
// inside etcd keys and file names alike.
func ValidateSKU(sku string) error {
	switch {
	case sku == "":
		return invalid("sku", sku, "must not be empty")
	case len(sku) > MaxSKULen:
		return invalid("sku", sku, "is %d bytes, longer than %d", len(sku), MaxSKULen)
	case sku == "." || sku == "..":
		return invalid("sku", sku, "must not be %q", sku)
	}
	for i := 0; i < len(sku); i++ {
		c := sku[i]
		if !isAlnum(c) && c != '.' && c != '_' && c != '-' {
			return invalid("sku", sku, "byte %d (%s) is not a letter, digit, '.', '_' or '-'", i, DescribeByte(sku, i))
		}
	}
	return nil
}

// ValidateOrderID checks an order ID: 1 to MaxOrderIDLen bytes of printable
// ASCII other than space and '/'.
func ValidateOrderID(id string) error {
	switch {
	case id == "":
		return invalid("order", id, "must not be empty")
	case len(id) > MaxOrderIDLen:
		return invalid("order", id, "is %d bytes, longer than %d", len(id), MaxOrderIDLen)
	}
	for i := 0; i < len(id); i++ {
		if c := id[i]; c <= ' ' || c >= 0x7f || c == '/' {
			return invalid("order", id, "byte %d (%s) is not printable ASCII other than space and '/'", i, DescribeByte(id, i))
		}
	}
	return nil
}

// ValidateQty checks the quantity of an allocation or restock: 1 to MaxQty.
func ValidateQty(qty int64) error {
	if qty < 1 || qty > MaxQty {
		return invalid("qty", qty, "must be between 1 and %d", MaxQty)
	}
	return nil
}

// ValidateRouteKey checks a route key: at most MaxRouteKeyLen bytes. The
// empty key is valid and means "route at random".
func ValidateRouteKey(key string) error {
	if len(key) > MaxRouteKeyLen {
		return invalid("route key", key[:32]+"...", "is %d bytes, longer than %d", len(key), MaxRouteKeyLen)
	}
	return nil
}

func isAlnum(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
}

// ValidateBuyer checks a buyer ID: 1 to MaxBuyerLen bytes of printable
// ASCII other than space and '/' (it becomes part of an etcd key).
func ValidateBuyer(buyer string) error {
	switch {
	case buyer == "":
		return invalid("buyer", buyer, "must not be empty")
	case len(buyer) > MaxBuyerLen:
		return invalid("buyer", buyer[:32]+"...", "is %d bytes, longer than %d", len(buyer), MaxBuyerLen)
	}
	for i := 0; i < len(buyer); i++ {
		if c := buyer[i]; c <= ' ' || c >= 0x7f || c == '/' {
			return invalid("buyer", buyer, "byte %d (%s) is not printable ASCII other than space and '/'", i, DescribeByte(buyer, i))
		}
	}
	return nil
}

// ValidateTTL checks a reservation's time to live: more than 0, at most
// MaxReservationTTL.
func ValidateTTL(ttl time.Duration) error {
	if ttl <= 0 || ttl > MaxReservationTTL {
		return invalid("ttl", ttl, "must be more than 0 and at most %v", MaxReservationTTL)
	}
	return nil
}

// DescribeByte names the byte at i of s for an error: the character it
// starts if s holds valid UTF-8 there ('É', U+00C9), else the byte in hex
// ('\x00', 0xc3): a byte quoted as a character of its own would show 'Ã'
// for the first byte of 'É'.
func DescribeByte(s string, i int) string {
	if r, n := utf8.DecodeRuneInString(s[i:]); r != utf8.RuneError || n > 1 {
		if n > 1 {
			return fmt.Sprintf("the first of %d bytes of %s, %U", n, strconv.QuoteRune(r), r)
		}
		return strconv.QuoteRune(r)
	}
	return fmt.Sprintf("0x%02x", s[i])
}
