package keys

import "testing"

// Reservation index keys sort by deadline and parse back; user keys too.
func TestReservationAndUserKeys(t *testing.T) {
	s, err := New("/shop")
	if err != nil {
		t.Fatal(err)
	}
	k := s.Reservation("tee", 1_700_000_000_123456789, "o-1")
	if want := "/shop/reservations/tee/1700000000123456789/o-1"; k != want {
		t.Fatalf("got %q, want %q", k, want)
	}
	if early := s.Reservation("tee", 5, "z"); !(early < k) || early != "/shop/reservations/tee/0000000000000000005/z" {
		t.Fatalf("%q does not sort before %q", early, k)
	}
	// The due range ends just after the deadlines at or before "at".
	if end := s.ReservationsDueEnd("tee", 1_700_000_000_123456789); !(k < end) || !(end < s.Reservation("tee", 1_700_000_000_123456790, "a")) {
		t.Fatalf("due end %q", end)
	}
	ns, order, err := s.ParseReservation("tee", k)
	if err != nil || ns != 1_700_000_000_123456789 || order != "o-1" {
		t.Fatalf("parse: %d %q %v", ns, order, err)
	}
	for _, bad := range []string{"/shop/reservations/tee/123/o-1", "/shop/reservations/tee/1700000000123456789/", "/shop/reservations/tee/1700000000123456789/a/b",
		"/shop/reservations/other/1700000000123456789/o-1", "/shop/reservations/tee/17000000001234567x9/o-1"} {
		if _, _, err := s.ParseReservation("tee", bad); err == nil {
			t.Errorf("ParseReservation(%q) accepted", bad)
		}
	}
	if u := s.User("tee", "amy"); u != "/shop/users/tee/amy" {
		t.Fatalf("user key %q", u)
	}
	if b, err := s.ParseUser("tee", "/shop/users/tee/amy"); err != nil || b != "amy" {
		t.Fatalf("ParseUser: %q %v", b, err)
	}
	for _, bad := range []string{"/shop/users/tee/", "/shop/users/tee/a/b", "/shop/users/other/amy"} {
		if _, err := s.ParseUser("tee", bad); err == nil {
			t.Errorf("ParseUser(%q) accepted", bad)
		}
	}
}
