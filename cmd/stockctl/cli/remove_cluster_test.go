package cli

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/stockctl/stockctl/internal/etcdtest"
)

// remove-cluster: refused (exit 5) while the cluster holds a SKU, naming
// it; refused (exit 2) for a lock cluster without --move-locks; done once
// the SKU is deleted, with its JSON shape. Then a process given the old
// list is refused, the new list serves, --endpoints reaches the removed
// cluster (to read its last events), and a merged cursor naming it is
// refused (exit 2), naming it.
func TestCLIRemoveCluster(t *testing.T) {
	t.Parallel()
	a, b, c := etcdtest.NewSingle(t, etcdtest.WithNoFsync()), etcdtest.NewSingle(t, etcdtest.WithNoFsync()),
		etcdtest.NewSingle(t, etcdtest.WithNoFsync())
	prefix := "/remove-cli/"
	two := []string{"--cluster", "a=" + a.Endpoints()[0], "--cluster", "b=" + b.Endpoints()[0], "--prefix", prefix, "--dial-timeout", "2s"}
	three := append(slices.Clone(two), "--cluster", "c="+c.Endpoints()[0])
	okRun := func(args ...string) string {
		t.Helper()
		r := run(t, args...)
		if r.code != 0 {
			t.Fatalf("stockctl %s: exit %d, stderr %q", strings.Join(args, " "), r.code, r.stderr)
		}
		return r.stdout
	}
	okRun(append(two, "list")...) // the fleet starts with a and b: its lock clusters
	okRun(append(three, "init", "x", "--cluster", "c", "--total", "10", "--segments", "1")...)
	okRun(append(three, "init", "y", "--cluster", "a", "--total", "10", "--segments", "1")...)
	okRun(append(three, "allocate", "x", "--order", "o1", "--qty", "2")...)

	if r := run(t, append(three, "remove-cluster", "c")...); r.code != ExitConflict || !strings.Contains(r.stderr, "x") ||
		!strings.Contains(r.stderr, "placed in it") {
		t.Fatalf("remove-cluster c holding x: exit %d, %q", r.code, r.stderr)
	}
	if r := run(t, append(three, "remove-cluster", "b")...); r.code != ExitUsage || !strings.Contains(r.stderr, "--move-locks") {
		t.Fatalf("remove-cluster b (a lock cluster): exit %d, %q", r.code, r.stderr)
	}
	if r := run(t, append(three, "remove-cluster", "a")...); r.code != ExitUsage || !strings.Contains(r.stderr, "registry") {
		t.Fatalf("remove-cluster a (the registry): exit %d, %q", r.code, r.stderr)
	}
	if r := run(t, append(three, "remove-cluster", "c", "--drain")...); r.code != ExitConflict || !strings.Contains(r.stderr, "draining") {
		t.Fatalf("remove-cluster c --drain holding x: exit %d, %q", r.code, r.stderr)
	}
	if r := run(t, append(three, "init", "w", "--cluster", "c", "--total", "10", "--segments", "1")...); r.code != ExitConflict ||
		!strings.Contains(r.stderr, "being removed") {
		t.Fatalf("init in draining c: exit %d, %q", r.code, r.stderr)
	}
	okRun(append(three, "delete", "x", "--force")...)
	out := okRun(append(three, "-o", "json", "remove-cluster", "c")...)
	checkShape(t, "remove-cluster", out, "cluster", "revision", "feedEnd", "clusters", "locks", "lockCluster", "tokensMayDrop", "unrewritten")
	var v removeClusterView
	decode(t, out, &v)
	if v.Cluster != "c" || v.Revision == 0 || v.FeedEnd == 0 || v.FeedEnd >= v.Revision || !slices.Equal(v.Clusters, []string{"a", "b"}) || v.LockCluster {
		t.Fatalf("remove-cluster c: %+v", v)
	}

	if r := run(t, append(three, "list")...); r.code == 0 || !strings.Contains(r.stderr, `cluster "c" was removed`) {
		t.Fatalf("list with the old list: exit %d, %q", r.code, r.stderr)
	}
	okRun(append(two, "allocate", "y", "--order", "o1", "--qty", "1")...)
	// The removed cluster's last events, read with --endpoints (a merged
	// cursor's consumer catching up before it drops c).
	if out := okRun("--endpoints", c.Endpoints()[0], "--prefix", prefix, "-o", "json", "orders", "--all", "--since", "1"); !strings.Contains(out, `"o1"`) ||
		!strings.Contains(out, `"x"`) {
		t.Fatalf("orders --all on removed c shows no order o1 of x:\n%s", out)
	}
	if r := run(t, append(two, "orders", "--all", "--since", "a=1,c=2")...); r.code != ExitUsage || !strings.Contains(r.stderr, `"c"`) ||
		!strings.Contains(r.stderr, fmt.Sprintf("c=%d", v.FeedEnd)) {
		t.Fatalf("orders --all with a cursor below removed c's end: exit %d, %q", r.code, r.stderr)
	}
	if r := run(t, append(two, "orders", "--all", "--since", "a=1")...); r.code != ExitUsage || !strings.Contains(r.stderr, `"c"`) {
		t.Fatalf("orders --all with a cursor that does not name removed c: exit %d, %q", r.code, r.stderr)
	}
	// From the start (a new consumer), and from a cursor at c's end: the
	// cursors printed carry c at its end.
	carried := fmt.Sprintf("c=%d", v.FeedEnd)
	for _, since := range [][]string{nil, {"--since", "a=1," + carried}} {
		out := okRun(append(append(two, "-o", "json", "orders", "--all"), since...)...)
		if !strings.Contains(out, `"y"`) || !strings.Contains(out, carried) {
			t.Fatalf("orders --all %v: no event of y, or its cursors do not carry %s:\n%s", since, carried, out)
		}
	}
}
