package cli

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/stockctl/stockctl/internal/etcdtest"
)

// ordersFields are the fields of every orders -o json line (buyer and
// deadline only when the order has them).
var ordersFields = []string{"revision", "event", "sku", "order", "qty", "parts", "reservation", "created", "snapshot", "cursor"}

// orderLines decodes orders -o json output, checking each line's shape.
func orderLines(t *testing.T, out string) []orderEventView {
	t.Helper()
	var vs []orderEventView
	for line := range strings.Lines(out) {
		var v orderEventView
		decode(t, line, &v)
		want := ordersFields
		if v.Buyer != "" {
			want = append(want, "buyer")
		}
		if v.Deadline != nil {
			want = append(want, "deadline")
		}
		if v.Lines != nil {
			want = append(want, "lines")
		}
		checkShape(t, "orders", line, append([]string(nil), want...)...)
		vs = append(vs, v)
	}
	return vs
}

func eventsOf(vs []orderEventView) []string {
	out := make([]string, len(vs))
	for i, v := range vs {
		out[i] = v.Event + " " + v.Order
	}
	return out
}

// orders prints every kind of change in etcd's order, resumes exactly
// after a line's cursor, starts from a snapshot, and follows live.
func TestOrdersCommand(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.ok("init", "tee", "--total", "100", "--segments", "2")
	e.ok("init", "mug", "--total", "100", "--segments", "1")
	e.ok("allocate", "tee", "--order", "o-1", "--qty", "2")
	e.ok("reserve", "tee", "--order", "r-1", "--qty", "1", "--ttl", "15m", "--buyer", "amy")
	e.ok("confirm", "tee", "--order", "r-1")
	e.ok("reserve", "mug", "--order", "m-1", "--qty", "1", "--ttl", "15m")
	e.ok("reserve", "tee", "--order", "r-2", "--qty", "1", "--ttl", "15m")
	e.ok("cancel", "tee", "--order", "r-2")
	e.ok("release", "tee", "--order", "o-1")

	r := e.run("-o", "json", "orders", "tee")
	if r.code != 0 {
		t.Fatalf("orders: exit %d: %s", r.code, r.stderr)
	}
	vs := orderLines(t, r.stdout)
	want := []string{"allocated o-1", "reserved r-1", "confirmed r-1", "reserved r-2", "cancelled r-2", "released o-1"}
	if got := eventsOf(vs); strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("orders tee: %v, want %v", got, want)
	}
	// The hint names the revision the command read up to: the last
	// line's cursor, or later when anything else was written to etcd
	// after it (a busy machine's test run saw 1604 after a last line at
	// 1603). Resuming there prints nothing more.
	last := vs[len(vs)-1]
	m := regexp.MustCompile(`resume with --since (\d+)`).FindStringSubmatch(r.stderr)
	if m == nil || last.Cursor < last.Revision {
		t.Fatalf("last line %+v, stderr %q: want the resume hint", last, r.stderr)
	}
	if hint, _ := strconv.ParseInt(m[1], 10, 64); hint < last.Cursor {
		t.Fatalf("resume hint --since %d is before the last line's cursor %d", hint, last.Cursor)
	}
	if rest := orderLines(t, e.ok("-o", "json", "orders", "tee", "--since", m[1])); len(rest) != 0 {
		t.Fatalf("--since %s (the hint): %v, want nothing", m[1], eventsOf(rest))
	}
	if vs[1].Buyer != "amy" || vs[1].Deadline == nil || !vs[1].Reservation || vs[0].Parts[0].Qty != 2 {
		t.Fatalf("lines lack the order's fields: %+v", vs[:2])
	}
	// Resume after any line: exactly the lines after it.
	for i, v := range vs {
		rest := orderLines(t, e.ok("-o", "json", "orders", "tee", "--since", fmt.Sprint(v.Cursor)))
		if got, want := eventsOf(rest), eventsOf(vs[i+1:]); strings.Join(got, ",") != strings.Join(want, ",") {
			t.Fatalf("--since %d: %v, want %v", v.Cursor, got, want)
		}
	}
	all := orderLines(t, e.ok("-o", "json", "orders", "--all"))
	if len(all) != len(vs)+1 {
		t.Fatalf("--all: %v", eventsOf(all))
	}
	if plain := e.ok("orders", "tee"); !strings.Contains(plain, "confirmed  tee  r-1  qty 1  1 from seg/") || !strings.Contains(plain, "buyer amy") {
		t.Fatalf("orders tee:\n%s", plain)
	}

	snap := orderLines(t, e.ok("-o", "json", "orders", "tee", "--snapshot"))
	if got := eventsOf(snap); strings.Join(got, ",") != "confirmed r-1,cancelled r-2,released o-1" {
		t.Fatalf("--snapshot: %v", got)
	}
	for i, v := range snap {
		if !v.Snapshot || (i < len(snap)-1) != (v.Cursor == 0) || (i == len(snap)-1 && v.Cursor < last.Revision) {
			t.Fatalf("snapshot line %d: %+v", i, v)
		}
	}

	w := startWatch(t, e.args("-o", "json", "orders", "tee", "--follow")...)
	eventually(t, "the history", func() bool { return strings.Count(w.out.String(), "\n") == len(vs) })
	e.ok("allocate", "tee", "--order", "o-live", "--qty", "1")
	eventually(t, "the live order", func() bool { return strings.Contains(w.out.String(), `"o-live"`) })
	if code := w.stop(t); code != ExitOK {
		t.Fatalf("orders --follow exited %d when interrupted: %s", code, w.errOut.String())
	}
	if got := eventsOf(orderLines(t, w.out.String())); got[len(got)-1] != "allocated o-live" || len(got) != len(vs)+1 {
		t.Fatalf("--follow: %v", got)
	}
}

// Bad input gets a clear error and its exit code.
func TestOrdersRefuses(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.ok("init", "tee", "--total", "10", "--segments", "1")
	e.ok("allocate", "tee", "--order", "o-1", "--qty", "1")
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"orders", "tee", "--since", "-1"}, ExitUsage, `invalid --since "-1"`},
		{[]string{"orders", "tee", "--since", "abc"}, ExitUsage, `invalid --since "abc"`},
		{[]string{"orders", "tee", "--since", "1e3"}, ExitUsage, `invalid --since "1e3"`},
		{[]string{"orders", "nope"}, ExitNotFound, `unknown SKU "nope"`},
		{[]string{"orders", "a/b"}, ExitUsage, "sku"},
		{[]string{"orders"}, ExitUsage, "missing SKU argument"},
		{[]string{"orders", "tee", "--all"}, ExitUsage, "--all takes no SKU argument"},
		{[]string{"orders", "tee", "--snapshot", "--since", "3"}, ExitUsage, "exclude each other"},
		{[]string{"orders", "tee", "--since", "999999999"}, ExitUsage, "cursor is ahead of etcd's current revision"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			r := e.fails(tc.code, tc.want, tc.args...)
			if r.stdout != "" {
				t.Fatalf("stdout %q", r.stdout)
			}
		})
	}

}

// A cursor older than etcd's compaction: exit 8, naming --snapshot; and
// --snapshot then works. On an etcd of its own: compacting the shared one
// would pull history from under the other tests.
func TestOrdersCompacted(t *testing.T) {
	t.Parallel()
	own := etcdtest.NewSingle(t, etcdtest.WithNoFsync())
	client := own.Client(t)
	args := func(a ...string) []string { return append([]string{"--endpoints", own.Endpoints()[0]}, a...) }
	for _, a := range [][]string{
		{"init", "tee", "--total", "10", "--segments", "1"},
		{"allocate", "tee", "--order", "o-1", "--qty", "1"},
		{"allocate", "tee", "--order", "o-2", "--qty", "1"},
	} {
		if r := run(t, args(a...)...); r.code != 0 {
			t.Fatalf("%v: exit %d: %s", a, r.code, r.stderr)
		}
	}
	resp, err := client.Get(t.Context(), "x")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := client.Compact(t.Context(), resp.Header.Revision, clientv3.WithCompactPhysical()); err != nil {
		t.Fatal(err)
	}
	r := run(t, args("orders", "tee", "--since", "1")...)
	if r.code != ExitCompacted || !strings.Contains(r.stderr, "--snapshot") || !strings.Contains(r.stderr, "compact") || r.stdout != "" {
		t.Fatalf("a compacted cursor: exit %d, stderr %q, stdout %q", r.code, r.stderr, r.stdout)
	}
	r = run(t, args("-o", "json", "orders", "tee", "--snapshot")...)
	if got := eventsOf(orderLines(t, r.stdout)); r.code != 0 || strings.Join(got, ",") != "allocated o-1,allocated o-2" {
		t.Fatalf("--snapshot after the compaction: exit %d, %v, stderr %q", r.code, got, r.stderr)
	}
}

// eventually waits, within a bound generous enough to only catch hangs,
// for cond to hold.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
