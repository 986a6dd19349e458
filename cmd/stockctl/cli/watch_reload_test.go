package cli

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stockctl/stockctl/coordinator"
	"github.com/stockctl/stockctl/internal/etcdtest"
)

// lastFrame is the last complete JSON line of out, decoded; ok is false
// before the first.
func lastFrame(t *testing.T, out string) (v watchView, ok bool) {
	t.Helper()
	for line := range strings.Lines(out) {
		if strings.HasSuffix(line, "\n") {
			v = watchView{} // fields a line omits (note) are not the last line's
			decode(t, line, &v)
			ok = true
		}
	}
	return v, ok
}

// When etcd has compacted the history the watch needs, the watch reloads
// the snapshot, says so on the next frame, and goes on following the SKU.
// Compaction is etcd-wide, so the test has an etcd of its own.
func TestStatusWatchReloadsAfterCompaction(t *testing.T) {
	t.Parallel()
	m := etcdtest.NewSingle(t, etcdtest.WithNoFsync())
	client := m.Client(t)
	coord, err := coordinator.New(client, coordinator.WithPrefix("/compacted/"))
	if err != nil {
		t.Fatal(err)
	}
	defer coord.Close()
	ctx := t.Context()
	if _, err := coord.CreateSKU(ctx, "cw", coordinator.SKUConfig{Total: 20, Segments: 2}); err != nil {
		t.Fatal(err)
	}
	var out, errs syncBuffer
	w := newSaleWatch(coord, "cw", 10*time.Second, &errs)
	if err := w.state.load(ctx, coord); err != nil {
		t.Fatal(err)
	}
	// Orders after the snapshot, then a compaction past them: the watch
	// cannot start where the snapshot ended.
	for i := range 3 {
		if _, err := coord.Allocate(ctx, "cw", fmt.Sprintf("o%d", i), 1, "k"); err != nil {
			t.Fatal(err)
		}
	}
	resp, err := client.Get(ctx, "/compacted/")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := client.Compact(ctx, resp.Header.Revision); err != nil {
		t.Fatal(err)
	}

	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- w.run(rctx, newWatchPrinter(&out, outputJSON, false, "", "")) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("run: %v", err)
		}
	}()
	etcdtest.WaitFor(t, "a frame after the reload", 30*time.Second, func() bool {
		v, ok := lastFrame(t, out.String())
		return ok && strings.Contains(v.Note, "compacted") && v.Allocated == 3
	})
	v, _ := lastFrame(t, out.String())
	if !strings.HasPrefix(v.Note, fmt.Sprintf("reloaded at revision %d: etcd compacted revision %d", w.state.loadRev, resp.Header.Revision)) ||
		v.Orders != 3 || v.Total != 20 {
		t.Fatalf("frame after the reload: %+v", v)
	}
	// And it follows the SKU again.
	if _, err := coord.Allocate(ctx, "cw", "o3", 2, "k"); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if t.Failed() {
			t.Logf("output:\n%s", out.String())
		}
	}()
	etcdtest.WaitFor(t, "a frame of the order after the reload", 30*time.Second, func() bool {
		v, ok := lastFrame(t, out.String())
		return ok && v.Allocated == 5 && v.Orders == 4 && v.Note == ""
	})
	if errs.String() != "" {
		t.Errorf("stderr: %q", errs.String())
	}
}

// A watch cut off by etcd going away and coming back carries on: the
// orders placed after the restart show up.
func TestStatusWatchSurvivesEtcdRestart(t *testing.T) {
	t.Parallel()
	m := etcdtest.NewSingle(t, etcdtest.WithNoFsync())
	ep := []string{"--endpoints", m.Endpoints()[0], "--prefix", "/restarted/"}
	mustRun := func(args ...string) {
		t.Helper()
		if r := run(t, append(ep, args...)...); r.code != 0 {
			t.Fatalf("%v: %+v", args, r)
		}
	}
	mustRun("init", "rw", "--total", "10", "--segments", "2")
	w := startWatch(t, append(ep, "-o", "json", "status", "rw", "--watch")...)
	etcdtest.WaitFor(t, "the first frame", 30*time.Second, func() bool { _, ok := lastFrame(t, w.out.String()); return ok })
	mustRun("allocate", "rw", "--order", "before", "--qty", "1")
	etcdtest.WaitFor(t, "the order before the restart", 30*time.Second, func() bool {
		v, _ := lastFrame(t, w.out.String())
		return v.Allocated == 1
	})

	m.Restart(t)
	// The client reconnects with backoff: retry until etcd answers again.
	etcdtest.WaitFor(t, "an order after the restart", 60*time.Second, func() bool {
		return run(t, append(ep, "allocate", "rw", "--order", "after", "--qty", "2")...).code == 0
	})
	etcdtest.WaitFor(t, "the order after the restart in a frame", 60*time.Second, func() bool {
		v, _ := lastFrame(t, w.out.String())
		return v.Allocated == 3 && v.Orders == 2
	})
	if code := w.stop(t); code != ExitOK {
		t.Fatalf("status --watch exited %d: %s", code, w.errOut.String())
	}
}
