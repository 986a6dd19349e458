package cli

import (
	"fmt"
	"strings"
	"testing"
)

// The JSON fields of every command are a contract with scripts: each
// command's happy path, with its exact field set.
func TestHappyPathsAndJSONShapes(t *testing.T) {
	t.Parallel()
	e := newEnv(t)

	out := e.ok("-o", "json", "init", "iphone", "--total", "100", "--segments", "4", "--initial-fill", "40", "--low-watermark", "5")
	checkShape(t, "init", out, "sku", "total", "segments", "initialFill", "lowWatermark", "refillBatch", "perUserLimit", "created")
	var sku skuView
	decode(t, out, &sku)
	if sku.SKU != "iphone" || sku.Total != 100 || sku.Segments != 4 || sku.InitialFill != 40 || sku.LowWatermark != 5 || sku.RefillBatch != 6 {
		t.Fatalf("init: %+v", sku)
	}

	out = e.ok("-o", "json", "allocate", "iphone", "--order", "o1", "--qty", "2", "--route-key", "user-1")
	checkShape(t, "allocate", out, "sku", "order", "qty", "parts", "revision", "replayed", "released")
	var a allocationView
	decode(t, out, &a)
	if a.SKU != "iphone" || a.Order != "o1" || a.Qty != 2 || a.Replayed || a.Revision == 0 ||
		len(a.Parts) != 1 || a.Parts[0].Qty != 2 || !strings.HasPrefix(a.Parts[0].From, "seg/") {
		t.Fatalf("allocate: %+v", a)
	}
	checkShape(t, "part", strings.TrimSpace(out[strings.Index(out, `"parts": [`)+len(`"parts": [`):strings.Index(out, "]")]), "from", "qty")

	// Retrying the same order replays it: same revision, nothing taken.
	var again allocationView
	e.json(&again, "allocate", "iphone", "--order", "o1", "--qty", "2")
	if !again.Replayed || again.Revision != a.Revision || again.Parts[0] != a.Parts[0] {
		t.Fatalf("replay: %+v, first %+v", again, a)
	}

	out = e.ok("-o", "json", "status", "iphone")
	checkShape(t, "status", out, "sku", "total", "pool", "allocated", "reserved", "reservations", "perUserLimit", "orders", "revision", "lowWatermark", "refillBatch", "segments", "leader", "rebalancer", "archived", "archivedOrders", "etcd")
	var st statusView
	decode(t, out, &st)
	if st.Total != 100 || st.Pool != 60 || st.Allocated != 2 || st.Orders != 1 || len(st.Segments) != 4 || st.Rebalancer != nil {
		t.Fatalf("status: %+v", st)
	}
	var sum int64
	for i, s := range st.Segments {
		if s.Index != i {
			t.Fatalf("segment %d has index %d", i, s.Index)
		}
		sum += s.Remaining
	}
	if sum != 38 {
		t.Fatalf("segments hold %d, want 38", sum)
	}
	seg := out[strings.Index(out, `"segments": [`)+len(`"segments": [`):]
	checkShape(t, "segment", strings.TrimSpace(seg[:strings.Index(seg, "}")+1]), "index", "remaining", "inbox")

	out = e.ok("-o", "json", "release", "iphone", "--order", "o1")
	checkShape(t, "release", out, "sku", "order", "qty", "parts", "released", "revision")
	var rel releaseView
	decode(t, out, &rel)
	if !rel.Released || rel.Qty != 2 || rel.Order != "o1" {
		t.Fatalf("release: %+v", rel)
	}
	e.json(&rel, "release", "iphone", "--order", "o1")
	if rel.Released {
		t.Fatalf("second release: %+v, want released false", rel)
	}
	// The order ID stays used: allocating it again replays the released order.
	e.json(&again, "allocate", "iphone", "--order", "o1", "--qty", "2")
	if !again.Replayed || !again.Released {
		t.Fatalf("allocate after release: %+v", again)
	}

	out = e.ok("-o", "json", "restock", "iphone", "--delivery", "dn-1", "--qty", "50")
	checkShape(t, "restock", out, "sku", "delivery", "qty", "total", "pool", "revision", "replayed")
	var rs restockView
	decode(t, out, &rs)
	if rs.Total != 150 || rs.Pool != 110 || rs.Replayed || rs.Delivery != "dn-1" || rs.Qty != 50 {
		t.Fatalf("restock: %+v", rs)
	}
	// A retry of the delivery (its first reply lost, an operator running it
	// again) replays it and adds nothing.
	var rsAgain restockView
	e.json(&rsAgain, "restock", "iphone", "--delivery", "dn-1", "--qty", "50")
	if !rsAgain.Replayed || rsAgain.Total != 150 || rsAgain.Revision != rs.Revision {
		t.Fatalf("restock again: %+v, want the first result replayed", rsAgain)
	}

	out = e.ok("-o", "json", "audit", "iphone")
	checkShape(t, "audit", out, "sku", "ok", "total", "pool", "segments", "allocated", "reserved", "confirmed", "orders", "releasedOrders", "expiredOrders", "buyers", "deliveries", "delivered", "archived", "archivedOrders", "revision", "problems")
	var au auditView
	decode(t, out, &au)
	if !au.OK || au.Total != 150 || au.Pool != 110 || au.Segments != 40 || au.Allocated != 0 || au.Orders != 1 || au.ReleasedOrders != 1 || len(au.Problems) != 0 ||
		au.Deliveries != 1 || au.Delivered != 50 {
		t.Fatalf("audit: %+v", au)
	}

	// A rebalancer pass: segment of user-1 is below the watermark 5 after
	// taking 6 of its 10.
	for i := range 6 {
		e.ok("allocate", "iphone", "--order", fmt.Sprintf("r%d", i), "--qty", "1", "--route-key", "user-1")
	}
	out = e.ok("-o", "json", "rebalance", "iphone", "--identity", "tester")
	checkShape(t, "rebalance", out, "sku", "leader", "revision", "moves", "expired")
	var pass passView
	decode(t, out, &pass)
	if pass.Leader != "tester" || len(pass.Moves) != 1 || pass.Moves[0].Kind != "refill" || pass.Moves[0].Qty != 6 {
		t.Fatalf("rebalance: %+v", pass)
	}
	move := out[strings.Index(out, `"moves": [`)+len(`"moves": [`):]
	checkShape(t, "move", strings.TrimSpace(move[:strings.Index(move, "}")+1]), "sku", "segment", "kind", "qty", "revision", "triggerRevision", "latencyMs", "leader")

	out = e.ok("-o", "json", "status", "iphone")
	decode(t, out, &st)
	if st.Rebalancer == nil || st.Rebalancer.Leader != "tester" || st.Rebalancer.Moves != 1 || st.Rebalancer.Moved != 6 {
		t.Fatalf("status after a pass: rebalancer %+v", st.Rebalancer)
	}
	rb := out[strings.Index(out, `"rebalancer": `)+len(`"rebalancer": `):]
	checkShape(t, "rebalancer", strings.TrimSpace(rb[:strings.Index(rb, "}")+1]), "leader", "at", "moves", "moved", "revision", "totalMoves", "totalMoved")
}

// Command flags may come before or after the SKU; global flags go before
// the command.
func TestFlagsBeforeOrAfterArguments(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.ok("init", "--total", "10", "--segments", "2", "mug")
	e.ok("init", "cup", "--total", "10", "--segments", "2")
	var a allocationView
	e.json(&a, "allocate", "mug", "--qty", "2", "--order", "o1")
	e.json(&a, "allocate", "--qty=2", "--order", "o2", "mug")
	e.json(&a, "allocate", "--order", "o3", "mug", "--qty", "1", "--route-key=k")
	if a.Order != "o3" || a.Qty != 1 {
		t.Fatalf("allocate: %+v", a)
	}
	var st statusView
	e.json(&st, "status", "mug")
	if st.Allocated != 5 {
		t.Fatalf("allocated %d, want 5", st.Allocated)
	}
	// A global flag after the command is refused with a hint.
	e.fails(ExitUsage, "put it before the command", "status", "mug", "-o", "json")
}

func TestTables(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.ok("init", "tv", "--total", "100", "--segments", "3", "--initial-fill", "30", "--low-watermark", "4")
	for i := range 8 {
		e.ok("allocate", "tv", "--order", fmt.Sprintf("o%d", i), "--qty", "1", "--route-key", "same-user")
	}
	out := e.ok("status", "tv")
	for _, want := range []string{"SKU         tv", "POOL        70", "ALLOCATED   8 units held by orders and live reservations; 8 order records (released and expired included)", "LEADER      none elected now", "REBALANCER  never ran",
		"SEGMENT  REMAINING  INBOX  LEVEL", "pool     70", "██████████████████████████████▸", " low", "a full bar is 10 units"} {
		if !strings.Contains(out, want) {
			t.Errorf("status table lacks %q:\n%s", want, out)
		}
	}
	out = e.ok("allocate", "tv", "--order", "x", "--qty", "3", "--route-key", "u")
	for _, want := range []string{"ORDER     x", "QTY       3", "REPLAYED  false", " from seg/"} {
		if !strings.Contains(out, want) {
			t.Errorf("allocate table lacks %q:\n%s", want, out)
		}
	}
	out = e.ok("audit", "tv")
	if !strings.Contains(out, "ok: the books balance") || !strings.Contains(out, "total 100 = pool 70 + segments 19 + allocated 11") {
		t.Errorf("audit table:\n%s", out)
	}
}

func TestBar(t *testing.T) {
	for _, tc := range []struct {
		v, full int64
		want    string
	}{
		{0, 10, ""},
		{5, 0, ""},
		{10, 10, strings.Repeat("█", barWidth)},
		{5, 10, strings.Repeat("█", barWidth/2)},
		{1, 1000, "▏"}, // never invisible
		{20, 10, strings.Repeat("█", barWidth) + "▸"},
		{1, 16, "█▉"}, // 30/16 = 1.875 cells = 1 full + 7/8
	} {
		if got := bar(tc.v, tc.full); got != tc.want {
			t.Errorf("bar(%d, %d) = %q, want %q", tc.v, tc.full, got, tc.want)
		}
	}
}
