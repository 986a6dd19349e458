package cli

import (
	"strings"
	"testing"
	"time"
)

// The reservation commands' contract with scripts: JSON fields, replays,
// and exit codes 5 (conflict), 6 (per-user limit) and 7 (expired); the
// per-user limit set by init; status and audit telling reserved from
// confirmed; a rebalance pass sweeping expired reservations. Every refusal
// changes nothing.
func TestReservationCommands(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	var sku skuView
	e.json(&sku, "init", "tee", "--total", "10", "--segments", "2", "--per-user-limit", "3")
	if sku.PerUserLimit != 3 {
		t.Fatalf("init: %+v", sku)
	}

	out := e.ok("-o", "json", "reserve", "tee", "--order", "r1", "--qty", "2", "--ttl", "1h", "--buyer", "amy")
	checkShape(t, "reserve", out, "sku", "order", "qty", "parts", "revision", "replayed", "released", "buyer", "state", "deadline")
	var a allocationView
	decode(t, out, &a)
	if a.State != "reserved" || a.Buyer != "amy" || a.Deadline == nil || time.Until(*a.Deadline) < 50*time.Minute {
		t.Fatalf("reserve: %+v", a)
	}
	var again allocationView
	e.json(&again, "reserve", "tee", "--order", "r1", "--qty", "2", "--ttl", "5m", "--buyer", "amy")
	if !again.Replayed || !again.Deadline.Equal(*a.Deadline) {
		t.Fatalf("reserve retry: %+v", again)
	}

	var st statusView
	e.json(&st, "status", "tee")
	if st.Allocated != 2 || st.Reserved != 2 || st.Reservations != 1 || st.PerUserLimit != 3 {
		t.Fatalf("status after reserve: %+v", st)
	}

	// 6: over the per-user limit, for reserve and allocate alike.
	before := fingerprint(t, e.prefix)
	e.fails(ExitLimitExceeded, `buyer "amy": per-user limit exceeded: holds 2, wants 2 more, limit 3`,
		"reserve", "tee", "--order", "r2", "--qty", "2", "--ttl", "1h", "--buyer", "amy")
	e.fails(ExitLimitExceeded, "per-user limit exceeded", "allocate", "tee", "--order", "a2", "--qty", "2", "--buyer", "amy")
	e.fails(ExitUsage, `invalid buyer "": is required: the SKU has a per-user limit of 3`, "allocate", "tee", "--order", "a3", "--qty", "1")
	e.fails(ExitUsage, "--buyer", "reserve", "tee", "--order", "a4", "--qty", "1", "--ttl", "1h", "--buyer", "a/b")
	e.fails(ExitUsage, "--ttl", "reserve", "tee", "--order", "a5", "--qty", "1", "--ttl", "0s", "--buyer", "bob")
	e.fails(ExitUsage, "--ttl", "reserve", "tee", "--order", "a6", "--qty", "1", "--ttl", "25h", "--buyer", "bob")
	e.fails(ExitUsage, "--ttl", "reserve", "tee", "--order", "a7", "--qty", "1", "--buyer", "bob")
	e.fails(ExitNotFound, "order not found", "confirm", "tee", "--order", "ghost")
	if after := fingerprint(t, e.prefix); !sameFingerprint(before, after) {
		t.Fatalf("a refusal changed etcd:\nbefore %v\nafter  %v", before, after)
	}

	out = e.ok("-o", "json", "confirm", "tee", "--order", "r1")
	checkShape(t, "confirm", out, "sku", "order", "qty", "parts", "buyer", "deadline", "revision", "replayed")
	var cv confirmView
	decode(t, out, &cv)
	if cv.Replayed || cv.Qty != 2 {
		t.Fatalf("confirm: %+v", cv)
	}
	e.json(&cv, "confirm", "tee", "--order", "r1")
	if !cv.Replayed {
		t.Fatalf("confirm again: %+v", cv)
	}
	e.fails(ExitConflict, "was confirmed", "cancel", "tee", "--order", "r1")

	// Cancel gives the units and the quota back.
	e.ok("reserve", "tee", "--order", "r3", "--qty", "1", "--ttl", "1h", "--buyer", "amy")
	out = e.ok("-o", "json", "cancel", "tee", "--order", "r3")
	checkShape(t, "cancel", out, "sku", "order", "qty", "parts", "released", "revision", "state", "buyer")
	var rel releaseView
	decode(t, out, &rel)
	if !rel.Released || rel.State != "reserved" {
		t.Fatalf("cancel: %+v", rel)
	}
	e.fails(ExitConflict, "was cancelled", "confirm", "tee", "--order", "r3")

	// 7: a reservation past its deadline. The one confirm finds due expires
	// it itself; one left alone is swept by a rebalance pass.
	e.ok("reserve", "tee", "--order", "r4", "--qty", "1", "--ttl", "1ms", "--buyer", "bob")
	e.ok("reserve", "tee", "--order", "r5", "--qty", "1", "--ttl", "1ms", "--buyer", "cat")
	time.Sleep(10 * time.Millisecond) // let the 1 ms deadlines pass
	e.fails(ExitExpired, "reservation expired", "confirm", "tee", "--order", "r4")
	e.fails(ExitExpired, "reservation expired", "confirm", "tee", "--order", "r4")
	e.fails(ExitExpired, "reservation expired", "cancel", "tee", "--order", "r4")
	r := e.run("reserve", "tee", "--order", "r4", "--qty", "1", "--ttl", "1h", "--buyer", "bob")
	if r.code != ExitExpired || !strings.Contains(r.stderr, "expired") {
		t.Fatalf("reserve retry of an expired reservation: exit %d, stderr %q", r.code, r.stderr)
	}
	var pass passView
	e.json(&pass, "rebalance", "tee")
	if len(pass.Expired) != 1 || pass.Expired[0].Order != "r5" {
		t.Fatalf("rebalance pass expired %+v, want r5", pass.Expired)
	}

	var au auditView
	e.json(&au, "audit", "tee")
	if !au.OK || au.Reserved != 0 || au.Confirmed != 2 || au.ExpiredOrders != 2 || au.ReleasedOrders != 1 || au.Buyers != 1 {
		t.Fatalf("audit: %+v", au)
	}
}

func sameFingerprint(a, b map[string]int64) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}
