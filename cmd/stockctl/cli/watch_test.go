package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stockctl/stockctl/coordinator"
	"github.com/stockctl/stockctl/internal/engines"
	"github.com/stockctl/stockctl/internal/etcdtest"
)

// watchFields are the fields of every status --watch JSON object (note,
// reserved and confirmed are absent unless they have a value).
var watchFields = []string{"sku", "at", "revision", "total", "pool", "allocated", "orders", "ordersPerSec",
	"refillsPerSec", "rateWindowSeconds", "lowWatermark", "refillBatch", "leader", "leaderLease", "rebalancer",
	"poolHolder", "poolHolderIdentity", "segments"}

// watchRun is a status --watch (or any command) running in-process until
// stopped, as if by ^C.
type watchRun struct {
	out, errOut syncBuffer
	cancel      context.CancelFunc
	done        chan int
}

func startWatch(t *testing.T, args ...string) *watchRun {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	w := &watchRun{cancel: cancel, done: make(chan int, 1)}
	go func() { w.done <- runCtx(ctx, &w.out, &w.errOut, args...) }()
	t.Cleanup(func() { w.stop(t) })
	return w
}

// stop interrupts the command and returns its exit status.
func (w *watchRun) stop(t *testing.T) int {
	t.Helper()
	w.cancel()
	select {
	case code := <-w.done:
		w.done <- code // for a second stop (the cleanup)
		return code
	case <-time.After(30 * time.Second):
		t.Fatalf("the command did not end when interrupted; stderr %q", w.errOut.String())
		return -1
	}
}

// lines are the complete JSON lines printed so far, decoded.
func (w *watchRun) frames(t *testing.T) []watchView {
	t.Helper()
	var vs []watchView
	for line := range strings.Lines(w.out.String()) {
		if !strings.HasSuffix(line, "\n") {
			break // still being written
		}
		var v watchView
		decode(t, line, &v)
		vs = append(vs, v)
	}
	return vs
}

// sell allocates from sku with buyers goroutines, 1 or 2 units an order,
// until it is sold out (exit 3). Every other outcome fails the test.
func sell(t *testing.T, e *env, sku string, buyers int) {
	t.Helper()
	var wg sync.WaitGroup
	errs := make(chan string, buyers)
	for b := range buyers {
		wg.Go(func() {
			for i := 0; ; i++ {
				r := e.run("allocate", sku, "--order", fmt.Sprintf("b%d-%d", b, i), "--qty", fmt.Sprint(1+i%2),
					"--route-key", fmt.Sprintf("buyer-%d", b))
				switch r.code {
				case ExitOK:
				case ExitInsufficientStock:
					if i%2 == 1 {
						continue // 2 units refused; 1 may be left
					}
					return
				default:
					errs <- fmt.Sprintf("allocate: exit %d: %s", r.code, r.stderr)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

// -o json status --watch prints one JSON object per change while a sale
// runs: each is the SKU's books at its revision (the audit at that
// revision agrees), the stock only goes down, and the last one is what
// status says after the sale. ^C ends it with exit 0.
func TestStatusWatchJSON(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.ok("init", "jw", "--total", "120", "--segments", "4", "--initial-fill", "20", "--low-watermark", "3", "--refill-batch", "6")
	w := startWatch(t, e.args("-o", "json", "status", "jw", "--watch")...)
	etcdtest.WaitFor(t, "the first frame", 30*time.Second, func() bool { return len(w.frames(t)) > 0 })
	reb := startWatch(t, e.args("rebalance", "--watch", "--identity", "jw-rebalancer")...)

	sell(t, e, "jw", 4)
	var st statusView
	e.json(&st, "status", "jw")
	if st.Pool != 0 || st.Allocated != 120 {
		t.Fatalf("after the sale: %+v", st)
	}
	etcdtest.WaitFor(t, "a frame showing the sold-out SKU", 30*time.Second, func() bool {
		vs := w.frames(t)
		last := vs[len(vs)-1]
		return last.Pool == st.Pool && last.Allocated == st.Allocated && last.Orders == st.Orders
	})
	if code := w.stop(t); code != ExitOK {
		t.Fatalf("status --watch exited %d after ^C: %s", code, w.errOut.String())
	}
	if code := reb.stop(t); code != ExitOK {
		t.Fatalf("rebalance --watch exited %d: %s", code, reb.errOut.String())
	}

	out := w.out.String()
	for line := range strings.Lines(out) {
		checkShape(t, "status --watch", line, watchFields...)
	}
	vs := w.frames(t)
	if len(vs) < 3 {
		t.Fatalf("%d frames for a whole sale:\n%s", len(vs), out)
	}
	last := vs[len(vs)-1]
	for i, s := range st.Segments {
		if got := last.Segments[i].segmentView; got != s {
			t.Errorf("last frame's segment %d is %+v, status says %+v", i, got, s)
		}
	}

	coord, err := coordinator.New(shared.client, coordinator.WithPrefix(e.prefix))
	if err != nil {
		t.Fatal(err)
	}
	defer coord.Close()
	var prev watchView
	refilled := false
	for i, v := range vs {
		remaining := v.Pool
		for _, s := range v.Segments {
			remaining += s.Remaining
			refilled = refilled || s.Inbox > 0
		}
		if v.SKU != "jw" || v.Total != 120 || len(v.Segments) != 4 || v.LowWatermark != 3 || v.RefillBatch != 6 {
			t.Fatalf("frame %d: %+v", i, v)
		}
		if v.Total != remaining+v.Allocated {
			t.Fatalf("frame %d: total %d != pool + segments %d + allocated %d", i, v.Total, remaining, v.Allocated)
		}
		if i > 0 && (v.Revision < prev.Revision || v.Pool > prev.Pool || v.Allocated < prev.Allocated || v.Orders < prev.Orders) {
			t.Fatalf("frame %d went back:\n%+v\nafter\n%+v", i, v, prev)
		}
		// The frame is the state at its revision, read back from etcd's
		// history: never a mix of two revisions.
		a, err := coord.AuditAt(t.Context(), "jw", v.Revision)
		if err != nil {
			t.Fatal(err)
		}
		if !a.OK || a.Pool != v.Pool || a.Segments != remaining-v.Pool || a.Allocated != v.Allocated || a.Orders != v.Orders {
			t.Fatalf("frame %d at revision %d: pool %d, segments %d, allocated %d, orders %d; the audit there: %+v",
				i, v.Revision, v.Pool, remaining-v.Pool, v.Allocated, v.Orders, a)
		}
		prev = v
	}
	if last.Leader != "jw-rebalancer" || last.LeaderLease == "" {
		t.Errorf("last frame's leader %q (lease %q), want jw-rebalancer", last.Leader, last.LeaderLease)
	}
	if !refilled && last.Rebalancer == nil {
		t.Errorf("no frame shows a refill")
	}
}

// Off a terminal status --watch prints a block of plain lines per change,
// without escape codes; the last block is the sold-out SKU.
func TestStatusWatchPlain(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.ok("init", "pw", "--total", "40", "--segments", "2", "--initial-fill", "10", "--low-watermark", "2", "--refill-batch", "5")
	w := startWatch(t, e.args("status", "pw", "--watch")...)
	etcdtest.WaitFor(t, "the first block", 30*time.Second, func() bool { return strings.Contains(w.out.String(), "(HOLDER:") })
	reb := startWatch(t, e.args("rebalance", "--watch", "--identity", "pw-rebalancer")...)
	sell(t, e, "pw", 2)
	lastBlock := func() string {
		out := w.out.String()
		i := strings.LastIndex(out, "--- ")
		if i < 0 || !strings.HasSuffix(out, "\n\n") {
			return ""
		}
		return out[i:]
	}
	etcdtest.WaitFor(t, "a block showing the sold-out SKU", 30*time.Second, func() bool {
		b := lastBlock()
		return strings.Contains(b, "\nPOOL       0\n") && strings.Contains(b, "\nALLOCATED  40 units held by ")
	})
	if code := w.stop(t); code != ExitOK {
		t.Fatalf("status --watch exited %d after ^C: %s", code, w.errOut.String())
	}
	reb.stop(t)
	out := w.out.String()
	if strings.Contains(out, "\x1b") {
		t.Fatalf("escape codes off a terminal:\n%q", out)
	}
	blocks := strings.Count(out, "--- ")
	if blocks < 3 {
		t.Fatalf("%d blocks for a whole sale:\n%s", blocks, out)
	}
	// A segment's row may still name a holder: a seller's lock can outlive
	// the frame that showed the last unit go.
	for _, want := range []string{"SKU        pw\n", "TOTAL      40\n", "LEADER     pw-rebalancer (lease ",
		"SEGMENT  REMAINING  INBOX  LEVEL", "\npool     0\n", "\n0        0          0       low", "\n1        0          0       low"} {
		if !strings.Contains(lastBlock(), want) {
			t.Errorf("the last block does not show %q:\n%s", want, lastBlock())
		}
	}
	if w.errOut.String() != "" {
		t.Errorf("stderr: %q", w.errOut.String())
	}
}

// status --watch's usage and setup errors are status's.
func TestStatusWatchErrors(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	for _, tc := range []struct {
		name string
		args []string
		code int
		want string
	}{
		{"no SKU", []string{"status", "--watch"}, ExitUsage, "missing SKU argument (usage: stockctl status SKU [--watch])"},
		{"two SKUs", []string{"status", "a", "b", "--watch"}, ExitUsage, "too many arguments"},
		{"bad SKU", []string{"status", "a/b", "--watch"}, ExitUsage, "a/b"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := e.run(tc.args...)
			checkFails(t, r, tc.code, tc.want, tc.args)
			if r.stdout != "" {
				t.Fatalf("stdout %q", r.stdout)
			}
		})
	}
}

// status --watch of a SKU not created yet waits for it (it used to exit
// 4): it says so on stderr, and shows the SKU once it exists, until ^C.
func TestStatusWatchWaitsForSKU(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	w := startWatch(t, e.args("-o", "json", "--timeout", "2s", "status", "later", "--watch")...)
	etcdtest.WaitFor(t, "the waiting line", 30*time.Second, func() bool {
		return strings.Contains(w.errOut.String(), "no SKU later yet") && strings.Contains(w.errOut.String(), "waiting for it to be created")
	})
	e.ok("init", "later", "--total", "30", "--segments", "3")
	etcdtest.WaitFor(t, "the SKU's first frame", 30*time.Second, func() bool {
		v, ok := lastFrame(t, w.out.String())
		return ok && v.Total == 30 && len(v.Segments) == 3
	})
	if code := w.stop(t); code != 0 {
		t.Fatalf("exit %d after ^C, stderr %q", code, w.errOut.String())
	}
}

// The JSON of a frame without reserved and confirmed figures has no such
// fields; with them, it has both.
func TestWatchViewReservedConfirmed(t *testing.T) {
	t.Parallel()
	v := watchView{SKU: "x", Segments: []watchSegmentView{}}
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	checkShape(t, "frame", string(b), watchFields...)
	reserved, confirmed := int64(3), int64(2)
	v.Reserved, v.Confirmed = &reserved, &confirmed
	if b, err = json.Marshal(v); err != nil {
		t.Fatal(err)
	}
	checkShape(t, "frame", string(b), append(watchFields, "reserved", "confirmed")...)
	var text strings.Builder
	if err := writeTable(&text, v.table()); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(text.String(), "RESERVED   3\n") || !strings.Contains(text.String(), "CONFIRMED  2\n") {
		t.Fatalf("table:\n%s", text.String())
	}
}

// Everything that changes a SKU shows: a restock (total and pool in one
// frame), an order and its release, the lock a selling process keeps on
// its segment and gives back when idle; a deleted SKU ends the watch with
// exit 4.
func TestStatusWatchFollowsEveryChange(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.ok("init", "ev", "--total", "20", "--segments", "2", "--initial-fill", "10")
	w := startWatch(t, e.args("-o", "json", "status", "ev", "--watch")...)
	etcdtest.WaitFor(t, "the first frame", 30*time.Second, func() bool { return len(w.frames(t)) > 0 })
	wait := func(what string, cond func(v watchView) bool) {
		t.Helper()
		etcdtest.WaitFor(t, what, 30*time.Second, func() bool {
			v, ok := lastFrame(t, w.out.String())
			return ok && cond(v)
		})
	}

	e.ok("restock", "ev", "--delivery", "dn-ev", "--qty", "5")
	wait("the restock", func(v watchView) bool { return v.Total == 25 && v.Pool == 15 && v.Allocated == 0 })
	for _, v := range w.frames(t) {
		if v.Total-v.Pool != 10 {
			t.Fatalf("a frame with half a restock: %+v", v)
		}
	}

	coord, err := coordinator.New(shared.client, coordinator.WithPrefix(e.prefix), coordinator.WithIdentity("shop-9"))
	if err != nil {
		t.Fatal(err)
	}
	defer coord.Close()
	// An order with a step holds its segment (a plain one of a SKU this
	// process holds nothing of would be sold without a lock).
	a, err := coord.AllocateFunc(t.Context(), "ev", "o1", 3, "k", func(context.Context) error { return nil })
	if err != nil {
		t.Fatal(err)
	}
	sess, err := engines.Of(coord).Locks.Session(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	lease := leaseHex(int64(sess.Lease()))
	// The coordinator keeps the segment it sold from (a tenure) until it
	// has been idle for a while: its lease holds the segment's lock.
	seg := a.Parts[0].Place.Index()
	if len(a.Parts) != 1 || seg < 0 {
		t.Fatalf("3 of 5 units in each segment, taken from %+v", a.Parts)
	}
	wait("the order and its segment's holder, by lease and identity", func(v watchView) bool {
		return v.Allocated == 3 && v.Orders == 1 && v.Segments[seg].Holder == lease && v.Segments[seg].HolderIdentity == "shop-9"
	})
	wait("the idle segment given back", func(v watchView) bool { return v.Segments[seg].Holder == "" })

	if _, err := coord.Release(t.Context(), "ev", "o1"); err != nil {
		t.Fatal(err)
	}
	wait("the release", func(v watchView) bool { return v.Allocated == 0 && v.Orders == 1 })
	// A prune leaves a claim of o1's ID, which is no order; forgetting it
	// leaves nothing. A new order counts from there.
	e.ok("prune", "ev", "--older-than", "1ns")
	wait("the prune", func(v watchView) bool { return v.Orders == 0 })
	e.ok("prune", "ev", "--older-than", "1ns", "--keep-ids", "0")
	if _, err := coord.Allocate(t.Context(), "ev", "o2", 1, "k"); err != nil {
		t.Fatal(err)
	}
	wait("an order after the claim was forgotten", func(v watchView) bool { return v.Allocated == 1 && v.Orders == 1 })

	if _, err := shared.client.Delete(t.Context(), engines.Of(coord).Keys.Meta("ev")); err != nil {
		t.Fatal(err)
	}
	select {
	case code := <-w.done:
		w.done <- code
		if code != ExitNotFound || !strings.Contains(w.errOut.String(), "stockctl: failed to watch ev: unknown SKU: its meta record was deleted") {
			t.Fatalf("after the SKU was deleted: exit %d, stderr %q", code, w.errOut.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("status --watch goes on after the SKU was deleted; stdout:\n%s", w.out.String())
	}
}

// On a terminal, a burst of changes is drawn as few frames: each at least
// watchRedraw after the one before, besides one a watchTick to move the
// clock. The bound depends on how long the burst took, not on how fast
// the machine is; the last frame shows the last state.
func TestStatusWatchCoalescesOnATerminal(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.ok("init", "burst", "--total", "400", "--segments", "4")
	coord, err := coordinator.New(shared.client, coordinator.WithPrefix(e.prefix))
	if err != nil {
		t.Fatal(err)
	}
	defer coord.Close()
	var out, errs syncBuffer
	w := newSaleWatch(coord, "burst", 10*time.Second, &errs)
	if err := w.state.load(t.Context(), coord); err != nil {
		t.Fatal(err)
	}
	p := newWatchPrinter(&out, outputTable, true, "status --watch burst", "")
	p.size = func() (int, int) { return 60, 120 }
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	start := time.Now()
	go func() { done <- w.run(ctx, p) }()

	var wg sync.WaitGroup
	for b := range 20 {
		wg.Go(func() {
			for i := range 20 {
				if _, err := coord.Allocate(ctx, "burst", fmt.Sprintf("b%d-%d", b, i), 1, fmt.Sprint(b)); err != nil {
					t.Errorf("allocate: %v", err)
					return
				}
			}
		})
	}
	wg.Wait()
	etcdtest.WaitFor(t, "a frame of the sold-out SKU", 30*time.Second, func() bool {
		s := out.String()
		last := strings.LastIndex(s, ansiHome)
		return last >= 0 && strings.Contains(s[last:], "ALLOCATED  400 units held by orders and live reservations; 400 order records")
	})
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	elapsed := time.Since(start)
	frames := strings.Count(out.String(), ansiHome) - 1 // the first frame clears the screen with one more
	limit := 2 + int(elapsed/watchRedraw) + 1 + int(elapsed/watchTick)
	if frames > limit {
		t.Fatalf("%d frames in %v, more than %d", frames, elapsed, limit)
	}
	t.Logf("400 orders drawn in %d frames over %v", frames, elapsed.Round(time.Millisecond))
}

// Once the SKU has a reservation, every frame splits allocated into
// reserved (live reservations) and confirmed (the rest), and they follow
// reserve, confirm, cancel and a sweep's expiry.
func TestStatusWatchReservations(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.ok("init", "rw", "--total", "20", "--segments", "2", "--initial-fill", "10")
	w := startWatch(t, e.args("-o", "json", "status", "rw", "--watch")...)
	etcdtest.WaitFor(t, "the first frame", 30*time.Second, func() bool { return len(w.frames(t)) > 0 })
	if v := w.frames(t)[0]; v.Reserved != nil || v.Confirmed != nil {
		t.Fatalf("a frame of a SKU without reservations has reserved/confirmed: %+v", v)
	}
	wait := func(what string, reserved, confirmed int64) {
		t.Helper()
		etcdtest.WaitFor(t, what, 30*time.Second, func() bool {
			v, ok := lastFrame(t, w.out.String())
			return ok && v.Reserved != nil && v.Confirmed != nil && *v.Reserved == reserved && *v.Confirmed == confirmed &&
				v.Allocated == reserved+confirmed
		})
	}
	e.ok("allocate", "rw", "--order", "plain", "--qty", "1")
	e.ok("reserve", "rw", "--order", "r1", "--qty", "2", "--ttl", "1h")
	wait("a reservation", 2, 1)
	e.ok("confirm", "rw", "--order", "r1")
	wait("its confirmation", 0, 3)
	e.ok("reserve", "rw", "--order", "r2", "--qty", "3", "--ttl", "1h")
	wait("a second reservation", 3, 3)
	e.ok("cancel", "rw", "--order", "r2")
	wait("its cancellation", 0, 3)
	e.ok("reserve", "rw", "--order", "r3", "--qty", "4", "--ttl", "100ms")
	wait("a third reservation", 4, 3)
	// A rebalance pass sweeps it once it is due (the pass may run before
	// the deadline: then it expires nothing, and we try again).
	etcdtest.WaitFor(t, "the sweep of the third", 30*time.Second, func() bool {
		e.ok("rebalance", "rw")
		v, ok := lastFrame(t, w.out.String())
		return ok && v.Reserved != nil && *v.Reserved == 0
	})
	wait("its expiry", 0, 3)
	for _, v := range w.frames(t) {
		if v.Reserved != nil && (v.Confirmed == nil || *v.Reserved+*v.Confirmed != v.Allocated) {
			t.Fatalf("a frame whose reserved and confirmed do not add up to allocated: %+v", v)
		}
	}
}
