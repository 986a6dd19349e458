package embedetcd

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// startT starts a server in dir and closes it at cleanup.
func startT(t *testing.T, cfg Config) *Server {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	s, err := Start(ctx, cfg)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(s.Close)
	return s
}

func newClient(t *testing.T, s *Server) *clientv3.Client {
	t.Helper()
	c, err := clientv3.New(clientv3.Config{
		Endpoints:   s.Endpoints(),
		DialTimeout: 5 * time.Second,
		Logger:      zap.NewNop(),
	})
	if err != nil {
		t.Fatalf("clientv3.New(%v): %v", s.Endpoints(), err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func put(t *testing.T, c *clientv3.Client, k, v string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := c.Put(ctx, k, v); err != nil {
		t.Fatalf("Put(%q): %v", k, err)
	}
}

func get(t *testing.T, c *clientv3.Client, k string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := c.Get(ctx, k)
	if err != nil {
		t.Fatalf("Get(%q): %v", k, err)
	}
	if len(resp.Kvs) != 1 {
		t.Fatalf("Get(%q): %d kvs, want 1", k, len(resp.Kvs))
	}
	return string(resp.Kvs[0].Value)
}

func TestStartPutGetClose(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data") // does not exist yet: Start creates it
	s := startT(t, Config{Dir: dir})

	eps := s.Endpoints()
	if len(eps) != 1 || !strings.HasPrefix(eps[0], "http://127.0.0.1:") || strings.HasSuffix(eps[0], ":0") {
		t.Fatalf("Endpoints() = %v, want one http://127.0.0.1:<real port>", eps)
	}
	// The advertised URL must be the real one too, or MemberList/auto-sync
	// would hand clients ":0".
	if got := s.Etcd().Server.Cluster().Member(s.Etcd().Server.MemberID()).ClientURLs; len(got) != 1 || got[0] != eps[0] {
		t.Errorf("advertised client URLs = %v, want [%s]", got, eps[0])
	}
	if _, err := os.Stat(filepath.Join(dir, lockFileName)); err != nil {
		t.Errorf("lock file: %v", err)
	}

	c := newClient(t, s)
	put(t, c, "k", "v")
	if got := get(t, c, "k"); got != "v" {
		t.Fatalf("Get = %q, want v", got)
	}

	s.Close()
	s.Close() // idempotent
	select {
	case <-s.Etcd().Server.StopNotify():
	default:
		t.Fatal("etcd server still running after Close")
	}
}

func TestSecondStartOnSameDirFailsFast(t *testing.T) {
	dir := t.TempDir()
	first := startT(t, Config{Dir: dir, UnsafeNoFsync: true})

	// The ctx deadline is far beyond "fast": if the lock did not work, bbolt
	// would block and this would hang until the deadline instead of erroring.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	second, err := Start(ctx, Config{Dir: dir, UnsafeNoFsync: true})
	if err == nil {
		second.Close()
		t.Fatal("second Start on the same dir succeeded")
	}
	if !errors.Is(err, ErrDataDirInUse) {
		t.Fatalf("second Start: %v, want ErrDataDirInUse", err)
	}
	if !strings.Contains(err.Error(), dir) {
		t.Errorf("error %q does not name the dir %s", err, dir)
	}
	if ctx.Err() != nil {
		t.Fatalf("second Start only returned at the ctx deadline: %v", err)
	}

	// The failed attempt must not have disturbed the first server.
	put(t, newClient(t, first), "still", "up")
}

func TestRestartSeesOldData(t *testing.T) {
	dir := t.TempDir()
	s := startT(t, Config{Dir: dir})
	put(t, newClient(t, s), "k", "before-restart")
	s.Close()

	s2 := startT(t, Config{Dir: dir})
	if got := get(t, newClient(t, s2), "k"); got != "before-restart" {
		t.Fatalf("after restart Get = %q, want before-restart", got)
	}
}

func TestNonLoopbackRefused(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  Config
	}{
		{"client all interfaces", Config{ClientAddr: "0.0.0.0:0"}},
		{"client empty host", Config{ClientAddr: ":0"}},
		{"client private", Config{ClientAddr: "10.1.2.3:2379"}},
		{"peer documentation net", Config{PeerAddr: "192.0.2.1:2380"}},
		{"peer ipv6 any", Config{PeerAddr: "[::]:0"}},
		{"initial cluster", Config{
			Name:           "a",
			PeerAddr:       "127.0.0.1:2380",
			InitialCluster: "a=http://127.0.0.1:2380,b=http://10.0.0.2:2380",
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "data")
			tc.cfg.Dir = dir
			s, err := Start(context.Background(), tc.cfg)
			if err == nil {
				s.Close()
				t.Fatal("Start succeeded")
			}
			if !strings.Contains(err.Error(), "loopback") {
				t.Errorf("error %q does not say why", err)
			}
			// Refused before touching anything.
			if _, err := os.Stat(dir); !os.IsNotExist(err) {
				t.Errorf("data dir was created: %v", err)
			}
		})
	}
}

func TestConfigErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  Config
		want string
	}{
		{"no dir", Config{}, "Dir is required"},
		{"bad log level", Config{Dir: "x", LogLevel: "loud"}, "LogLevel"},
		{"bad cluster state", Config{Dir: "x", ClusterState: "old"}, "ClusterState"},
		{"bad addr", Config{Dir: "x", ClientAddr: "127.0.0.1"}, "ClientAddr"},
		{"multi member needs peer port", Config{Dir: "x", InitialCluster: "stockctl=http://127.0.0.1:2380"}, "explicit peer port"},
		{"name not in cluster", Config{Dir: "x", PeerAddr: "127.0.0.1:2380", InitialCluster: "other=http://127.0.0.1:2380"}, "no member named"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.cfg.Dir != "" {
				tc.cfg.Dir = filepath.Join(t.TempDir(), tc.cfg.Dir)
			}
			s, err := Start(context.Background(), tc.cfg)
			if err == nil {
				s.Close()
				t.Fatal("Start succeeded")
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q does not contain %q", err, tc.want)
			}
		})
	}
}

// etcdtest relies on a busy explicit port surfacing as EADDRINUSE so that it
// can retry a restart while the kernel still holds the old socket.
func TestBusyPortIsAddrInUseAndUnlocks(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()

	dir := t.TempDir()
	s, err := Start(context.Background(), Config{Dir: dir, ClientAddr: l.Addr().String(), UnsafeNoFsync: true})
	if err == nil {
		s.Close()
		t.Fatal("Start on a busy client port succeeded")
	}
	if !errors.Is(err, syscall.EADDRINUSE) {
		t.Fatalf("Start on busy port: %v, want EADDRINUSE", err)
	}
	// The failed Start must have released the lock.
	startT(t, Config{Dir: dir, UnsafeNoFsync: true})
}

func TestCanceledCtxCleansUp(t *testing.T) {
	dir := t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	s, err := Start(ctx, Config{Dir: dir, UnsafeNoFsync: true})
	if err == nil {
		// Not expected (becoming ready needs an election), but not a bug.
		s.Close()
		t.Skip("member became ready before the canceled ctx was noticed")
	}
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Start with canceled ctx: %v, want context.Canceled", err)
	}
	// Nothing may be left running or locked.
	startT(t, Config{Dir: dir, UnsafeNoFsync: true})
}

// helperDirEnv makes the test binary, re-executed by
// TestSecondProcessGetsErrDataDirInUse, act as a second stockctl process.
const helperDirEnv = "EMBEDETCD_TEST_HELPER_DIR"

func TestMain(m *testing.M) {
	if dir := os.Getenv(helperDirEnv); dir != "" {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		s, err := Start(ctx, Config{Dir: dir, UnsafeNoFsync: true})
		switch {
		case err == nil:
			s.Close()
			fmt.Println("STARTED")
		case errors.Is(err, ErrDataDirInUse):
			fmt.Println("IN_USE:", err)
		default:
			fmt.Println("OTHER:", err)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func TestSecondProcessGetsErrDataDirInUse(t *testing.T) {
	dir := t.TempDir()
	startT(t, Config{Dir: dir, UnsafeNoFsync: true})

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0])
	cmd.Env = append(os.Environ(), helperDirEnv+"="+dir)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("helper process: %v\n%s", err, out)
	}
	got := string(out)
	if !strings.HasPrefix(got, "IN_USE:") || !strings.Contains(got, dir) || !strings.Contains(got, fmt.Sprintf("pid %d", os.Getpid())) {
		t.Fatalf("second process: %q, want IN_USE naming %s and pid %d", got, dir, os.Getpid())
	}
}

// Open watch streams never end by themselves; etcd's own Close would wait
// its full request timeout (7s) for them. Close must cut them after a short
// grace instead. The bound is loose because the machine may be busy.
func TestCloseWithOpenWatchDoesNotWaitForRequestTimeout(t *testing.T) {
	s := startT(t, Config{Dir: t.TempDir(), UnsafeNoFsync: true})
	c := newClient(t, s)
	wch := c.Watch(context.Background(), "w")
	put(t, c, "w", "1")
	select {
	case <-wch:
	case <-time.After(10 * time.Second):
		t.Fatal("watch event not delivered")
	}

	start := time.Now()
	s.Close()
	took := time.Since(start)
	t.Logf("Close with an open watch took %v", took)
	if reqTimeout := 7 * time.Second; took >= reqTimeout-time.Second {
		t.Fatalf("Close took %v, close to etcd's request timeout %v: the watch stream was not cut", took, reqTimeout)
	}
}
