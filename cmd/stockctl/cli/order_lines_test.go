package cli

import (
	"strings"
	"testing"
)

// allocate and reserve with --line: every line taken in one commit (one
// revision), the JSON shape, a retry replayed, a short line refused with
// exit 3 naming it and changing nothing, other lines exit 5, usage errors
// exit 2, release of one line returning every line, the single-SKU form
// unchanged beside it.
func TestOrderLinesCommands(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.ok("init", "phone", "--total", "10", "--segments", "2")
	e.ok("init", "case", "--total", "3", "--segments", "1")

	out := e.ok("-o", "json", "allocate", "--order", "c1", "--line", "phone=2", "--line", "case=1")
	checkShape(t, "allocate --line", out, "order", "lines", "revision", "replayed", "released")
	var v orderView
	decode(t, out, &v)
	if len(v.Lines) != 2 || v.Lines[0].SKU != "phone" || v.Lines[0].Qty != 2 || v.Lines[1].SKU != "case" ||
		v.Lines[0].Revision != v.Revision || v.Lines[1].Revision != v.Revision || v.Replayed {
		t.Fatalf("allocate --line: %+v", v)
	}
	var again orderView
	e.json(&again, "allocate", "--order", "c1", "--line", "case=1,phone=2")
	if !again.Replayed || again.Revision != v.Revision {
		t.Fatalf("retry: %+v", again)
	}

	before := fingerprint(t, e.prefix)
	e.fails(ExitInsufficientStock, "line 1 (case, qty 5): insufficient stock: want 5, have 2",
		"allocate", "--order", "c2", "--line", "phone=1", "--line", "case=5")
	e.fails(ExitConflict, "conflict", "allocate", "--order", "c1", "--line", "phone=3", "--line", "case=1")
	e.fails(ExitUsage, "SKU=QTY", "allocate", "--order", "c3", "--line", "phone")
	e.fails(ExitUsage, "twice", "allocate", "--order", "c3", "--line", "phone=1", "--line", "phone=2")
	e.fails(ExitUsage, "--qty", "allocate", "--order", "c3", "--line", "phone=1", "--qty", "1")
	e.fails(ExitUsage, "SKU argument", "allocate", "phone", "--order", "c3", "--line", "case=1")
	e.fails(ExitUsage, "--ttl", "reserve", "--order", "c3", "--line", "case=1")
	if after := fingerprint(t, e.prefix); !sameFingerprint(before, after) {
		t.Fatalf("a refusal changed etcd:\nbefore %v\nafter  %v", before, after)
	}

	var r orderView
	e.json(&r, "reserve", "--order", "r1", "--line", "phone=1", "--line", "case=1", "--ttl", "1h")
	if r.State != "reserved" || r.Deadline == nil || len(r.Lines) != 2 {
		t.Fatalf("reserve --line: %+v", r)
	}
	e.ok("confirm", "case", "--order", "r1")
	var rel releaseView
	e.json(&rel, "release", "case", "--order", "c1")
	if !rel.Released || rel.Qty != 1 {
		t.Fatalf("release of one line: %+v", rel)
	}
	var st statusView
	e.json(&st, "status", "phone")
	if st.Allocated != 1 { // r1's phone: c1's 2 went back with its case line
		t.Fatalf("phone allocated %d, want 1", st.Allocated)
	}
	// The feed: one event per line, each naming the order's SKUs, every
	// line of a change at one revision.
	byRev := map[int64][]string{}
	for _, ev := range orderLines(t, e.ok("-o", "json", "orders", "--all")) {
		if ev.Order == "c1" {
			if strings.Join(ev.Lines, ",") != "case,phone" {
				t.Fatalf("event %+v: lines %v", ev, ev.Lines)
			}
			byRev[ev.Revision] = append(byRev[ev.Revision], ev.SKU)
		}
	}
	if len(byRev) != 2 { // allocated, released
		t.Fatalf("c1's events by revision: %v", byRev)
	}
	for rev, skus := range byRev {
		if len(skus) != 2 {
			t.Fatalf("revision %d has c1's lines %v", rev, skus)
		}
	}
	e.ok("allocate", "phone", "--order", "s1", "--qty", "1")
	e.ok("audit", "phone")
	e.ok("audit", "case")
}
