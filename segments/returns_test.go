package segments

import (
	"errors"
	"testing"
	"time"
)

// Which returns an order allows, decided on the record alone.
func TestReturnVerdict(t *testing.T) {
	now := time.Date(2026, 11, 24, 12, 0, 0, 0, time.UTC)
	due, later := now.Add(-time.Second), now.Add(time.Minute)
	plain := Order{ID: "p"}
	reserved := Order{ID: "r", State: StateReserved, Deadline: later}
	overdue := Order{ID: "o", State: StateReserved, Deadline: due}
	confirmed := Order{ID: "c", State: StateConfirmed, Deadline: due}
	expired := Order{ID: "x", State: StateExpired, Deadline: due}
	released := Order{ID: "l", Released: true}
	cancelled := Order{ID: "k", State: StateReserved, Deadline: later, Released: true}
	for _, tc := range []struct {
		kind    returnKind
		o       Order
		proceed bool
		err     error // nil: none
	}{
		{retRelease, plain, true, nil},
		{retRelease, reserved, true, nil},
		{retRelease, confirmed, true, nil},
		{retRelease, released, false, nil}, // already released: said so, nothing done
		{retRelease, expired, false, ErrExpired},
		{retCancel, reserved, true, nil},
		{retCancel, overdue, true, nil}, // not swept yet: a cancel still returns it
		{retCancel, plain, false, ErrConflict},
		{retCancel, confirmed, false, ErrConflict},
		{retCancel, expired, false, ErrExpired},
		{retCancel, cancelled, false, nil},
		{retExpire, overdue, true, nil},
		{retExpire, reserved, false, errNotDue},
		{retExpire, confirmed, false, errNotDue},
		{retExpire, cancelled, false, errNotDue},
	} {
		proceed, err := returnVerdict(tc.kind, tc.o, 7, now)
		if proceed != tc.proceed || (tc.err == nil) != (err == nil) || (tc.err != nil && !errors.Is(err, tc.err)) {
			t.Errorf("returnVerdict(%d, %+v) = %v, %v; want %v, %v", tc.kind, tc.o, proceed, err, tc.proceed, tc.err)
		}
	}
}
