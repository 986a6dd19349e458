package cli

import (
	"context"
	"fmt"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stockctl/stockctl/internal/embedetcd"
	"github.com/stockctl/stockctl/internal/etcdtest"
)

// Without --endpoints, each command runs its own embedded etcd on the data
// dir, so that init, allocate and status work in turn on a fresh machine.
func TestEmbeddedDefault(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "stockctl.etcd")
	dd := []string{"--data-dir", dir}
	// The first command creates the data dir and says so (a command run
	// in another directory would otherwise find "no SKUs" and say nothing
	// of why); the next, finding it, says nothing.
	for i, args := range [][]string{
		{"init", "iphone", "--total", "10", "--segments", "2"},
		{"allocate", "iphone", "--qty", "2", "--order", "o1"},
	} {
		r := run(t, append(dd, args...)...)
		if r.code != 0 {
			t.Fatalf("%v: %+v", args, r)
		}
		if says := strings.Contains(r.stderr, "no data dir "+dir+" here: created a new, empty embedded etcd"); says != (i == 0) {
			t.Fatalf("%v: stderr %q (says it created the data dir: %v, want %v)", args, r.stderr, says, i == 0)
		}
	}
	r := run(t, append(dd, "-o", "json", "status", "iphone")...)
	var st statusView
	decode(t, r.stdout, &st)
	if st.Allocated != 2 || st.Orders != 1 {
		t.Fatalf("status: %+v", st)
	}

	// A second stockctl on a data dir in use fails at once and says why.
	srv, err := embedetcd.Start(t.Context(), embedetcd.Config{Dir: dir, UnsafeNoFsync: true})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	start := time.Now()
	r = run(t, append(dd, "status", "iphone")...)
	checkFails(t, r, ExitFailure, "data dir is in use", nil)
	if !strings.Contains(r.stderr, dir) || !strings.Contains(r.stderr, "--endpoints") {
		t.Fatalf("stderr %q does not name the dir and what to do", r.stderr)
	}
	// Failing late would mean waiting out the embedded etcd's 30 s ready
	// timeout.
	if took := time.Since(start); took > 20*time.Second {
		t.Fatalf("took %v to fail", took)
	}
}

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// servedEtcd is a stockctl serve running in-process on a loopback port
// and a data dir of its own, until stop.
type servedEtcd struct {
	addr, dir   string
	out, errOut syncBuffer
	cancel      context.CancelFunc
	done        chan int
}

// startServe runs serve with the rebalancer's identity and extra flags,
// and returns once it says where its etcd is.
func startServe(t *testing.T, identity string, extra ...string) *servedEtcd {
	t.Helper()
	s := &servedEtcd{addr: freeAddr(t), dir: filepath.Join(t.TempDir(), identity+".etcd"), done: make(chan int, 1)}
	ctx, cancel := context.WithCancel(context.Background())
	s.cancel = cancel
	t.Cleanup(cancel)
	args := append([]string{"--data-dir", s.dir, "serve", "--listen", s.addr, "--api-addr", "127.0.0.1:0", "--identity", identity}, extra...)
	go func() { s.done <- runCtx(ctx, &s.out, &s.errOut, args...) }()
	etcdtest.WaitFor(t, "serve to start", 30*time.Second, func() bool {
		return strings.Contains(s.out.String(), "export STOCKCTL_ENDPOINTS=http://"+s.addr)
	})
	return s
}

// ok runs a stockctl command against the served etcd; it must succeed.
func (s *servedEtcd) ok(t *testing.T, args ...string) string {
	t.Helper()
	r := run(t, append([]string{"--endpoints", "http://" + s.addr}, args...)...)
	if r.code != 0 {
		t.Fatalf("%v: %+v", args, r)
	}
	return r.stdout
}

// stop interrupts serve, which must exit 0.
func (s *servedEtcd) stop(t *testing.T) {
	t.Helper()
	s.cancel()
	select {
	case code := <-s.done:
		if code != 0 {
			t.Fatalf("serve exited %d: %s", code, s.errOut.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatal("serve did not stop when interrupted")
	}
}

// serve runs an etcd several processes share, and the rebalancer, until
// interrupted.
func TestServe(t *testing.T) {
	t.Parallel()
	srv := startServe(t, "served")
	srv.ok(t, "init", "tee", "--total", "100", "--segments", "2", "--initial-fill", "10", "--low-watermark", "4", "--refill-batch", "20")
	for i := range 3 {
		srv.ok(t, "allocate", "tee", "--order", fmt.Sprintf("o%d", i), "--qty", "1", "--route-key", "same")
	}
	// The served rebalancer refills the segment that fell below 4.
	etcdtest.WaitFor(t, "a refill by the served rebalancer", 20*time.Second, func() bool {
		var st statusView
		decode(t, srv.ok(t, "-o", "json", "status", "tee"), &st)
		return st.Rebalancer != nil && st.Rebalancer.Leader == "served" && st.Pool == 70
	})
	if !strings.Contains(srv.out.String(), "refill  tee  pool → seg/") {
		t.Errorf("serve printed no move:\n%s", srv.out.String())
	}
	// The data dir is taken while serve runs.
	checkFails(t, run(t, "--data-dir", srv.dir, "status", "tee"), ExitFailure, "in use", nil)

	srv.stop(t)
	// Its data survives: the next command on the data dir sees it.
	var st statusView
	decode(t, run(t, "--data-dir", srv.dir, "-o", "json", "status", "tee").stdout, &st)
	if st.Allocated != 3 {
		t.Fatalf("after serve: %+v", st)
	}
}

// rebalance --watch runs the rebalancer, printing a JSON line per move,
// until interrupted.
func TestRebalanceWatch(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.ok("init", "cap", "--total", "50", "--segments", "2", "--initial-fill", "10", "--low-watermark", "3", "--refill-batch", "5")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var out, errOut syncBuffer
	done := make(chan int, 1)
	go func() {
		done <- runCtx(ctx, &out, &errOut, e.args("-o", "json", "rebalance", "--watch", "cap", "--identity", "watcher")...)
	}()
	for i := range 3 {
		e.ok("allocate", "cap", "--order", fmt.Sprintf("w%d", i), "--qty", "1", "--route-key", "k")
	}
	etcdtest.WaitFor(t, "a move line", 20*time.Second, func() bool { return strings.Contains(out.String(), "\n") })
	line := strings.SplitN(out.String(), "\n", 2)[0]
	checkShape(t, "move", line, "sku", "segment", "kind", "qty", "revision", "triggerRevision", "latencyMs", "leader")
	var m moveView
	decode(t, line, &m)
	if m.SKU != "cap" || m.Kind != "refill" || m.Qty != 5 || m.Leader != "watcher" {
		t.Fatalf("move %+v", m)
	}
	cancel()
	select {
	case code := <-done:
		if code != 0 {
			t.Fatalf("rebalance --watch exited %d: %s", code, errOut.String())
		}
	case <-time.After(20 * time.Second):
		t.Fatal("rebalance --watch did not stop when interrupted")
	}
}
