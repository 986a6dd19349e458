//go:build unix

package clients_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/stockctl/stockctl/coordinator"
	"github.com/stockctl/stockctl/internal/etcdtest"
)

// token is the bearer token every serve of these tests accepts.
const token = "client-test-token-0123456789"

// procBound bounds a process's start or stop: a bound on a hang, not a
// measurement.
const procBound = 60 * time.Second

var built struct {
	once sync.Once
	path string
	err  error
}

// stockctlBinary builds cmd/stockctl once per test binary.
func stockctlBinary(t *testing.T) string {
	t.Helper()
	built.once.Do(func() {
		dir, err := os.MkdirTemp("", "stockctl-clients-bin")
		if err != nil {
			built.err = err
			return
		}
		goBin, err := exec.LookPath("go")
		if err != nil {
			goBin = filepath.Join(runtime.GOROOT(), "bin", "go")
		}
		built.path = filepath.Join(dir, "stockctl")
		out, err := exec.Command(goBin, "build", "-o", built.path, "github.com/stockctl/stockctl/cmd/stockctl").CombinedOutput()
		if err != nil {
			built.err = fmt.Errorf("go build stockctl: %v: %s", err, out)
		}
	})
	if built.err != nil {
		t.Fatal(built.err)
	}
	return built.path
}

// serve is a `stockctl serve` OS process.
type serve struct {
	cmd    *exec.Cmd
	out    bytes.Buffer
	errOut syncBuffer
	exited chan struct{}
	API    string   // host:port of its API
	Etcd   []string // its etcd's endpoints
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// startServe runs `stockctl -o json [global...] serve --api-addr
// 127.0.0.1:0 --api-tokens FILE`: with no --endpoints in global, on an
// embedded etcd of its own (in a temp dir, on a free port). It returns once
// serve printed where its API is; at cleanup it is stopped.
func startServe(t *testing.T, global ...string) *serve {
	t.Helper()
	dir := t.TempDir()
	tokens := filepath.Join(dir, "tokens")
	if err := os.WriteFile(tokens, []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	args := append([]string{"-o", "json", "--data-dir", filepath.Join(dir, "etcd")}, global...)
	args = append(args, "serve", "--api-addr", "127.0.0.1:0", "--api-tokens", tokens)
	if !hasEndpoints(global) {
		args = append(args, "--listen", "127.0.0.1:0")
	}
	s := &serve{exited: make(chan struct{})}
	s.cmd = exec.Command(stockctlBinary(t), args...)
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	s.cmd.Stdout, s.cmd.Stderr = pw, &s.errOut
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := s.cmd.Start(); err != nil {
		t.Fatalf("start stockctl serve: %v", err)
	}
	pw.Close()
	go func() { _ = s.cmd.Wait(); close(s.exited) }()
	t.Cleanup(func() {
		_ = s.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-s.exited:
		case <-time.After(procBound):
			_ = s.cmd.Process.Kill()
			<-s.exited
		}
		pr.Close()
	})
	line := make(chan string, 1)
	go func() {
		var b [1]byte
		var l []byte
		for {
			if n, err := pr.Read(b[:]); n == 0 || err != nil || b[0] == '\n' {
				line <- string(l)
				return
			}
			l = append(l, b[0])
		}
	}()
	select {
	case l := <-line:
		var view struct {
			Endpoints []string `json:"endpoints"`
			API       string   `json:"api"`
		}
		if err := json.Unmarshal([]byte(l), &view); err != nil || view.API == "" {
			t.Fatalf("stockctl serve's first line %q: %v; stderr:\n%s", l, err, s.errOut.String())
		}
		s.API, s.Etcd = strings.TrimPrefix(view.API, "http://"), view.Endpoints
	case <-time.After(procBound):
		t.Fatalf("stockctl serve did not say where its API is; stderr:\n%s", s.errOut.String())
	}
	// Drain the rest of stdout so that serve never blocks on it.
	go func() {
		var b [4096]byte
		for {
			if _, err := pr.Read(b[:]); err != nil {
				return
			}
		}
	}()
	return s
}

func hasEndpoints(args []string) bool {
	for _, a := range args {
		if a == "--endpoints" || strings.HasPrefix(a, "--endpoints=") || a == "--cluster" || strings.HasPrefix(a, "--cluster=") {
			return true
		}
	}
	return false
}

// fleet is what a client's suite runs against: serve A (embedded etcd) and
// serve B (another process on A's etcd) that the suite kills, and a
// revision below which A's etcd has compacted its history.
type fleet struct {
	a, b      *serve
	compacted int64
	pruned    string // a SKU whose order "gone" was pruned
	clusters  *clusterFleet
}

// clusterFleet is what a client's suite runs its feed consumers over
// several clusters against: two embedded etcd clusters, "a" and "b", and
// two serves over both (m1, and m2, which the suite kills), with a SKU
// created in each cluster, and cluster a's history compacted up to
// compacted (a cursor of a before it is refused).
type clusterFleet struct {
	m1, m2       *serve
	skuA, skuB   string
	compactedA   int64
	etcdA, etcdB *etcdtest.Single
}

// newClusterFleet starts a clusterFleet.
func newClusterFleet(t *testing.T) *clusterFleet {
	t.Helper()
	a, b := etcdtest.NewSingle(t, etcdtest.WithNoFsync()), etcdtest.NewSingle(t, etcdtest.WithNoFsync())
	ctx, cancel := context.WithTimeout(context.Background(), procBound)
	defer cancel()
	ca, cb := a.Client(t), b.Client(t)
	c, err := coordinator.NewClusters(ctx, []coordinator.Cluster{{Name: "a", Client: ca}, {Name: "b", Client: cb}})
	if err != nil {
		t.Fatal(err)
	}
	f := &clusterFleet{skuA: "merged-in-a", skuB: "merged-in-b", etcdA: a, etcdB: b}
	for _, p := range []struct{ cluster, sku string }{{"a", f.skuA}, {"b", f.skuB}} {
		if _, err := c.CreateSKUIn(ctx, p.cluster, p.sku, coordinator.SKUConfig{Total: 1000, Segments: 2, InitialFill: 1000}); err != nil {
			t.Fatal(err)
		}
	}
	c.Close()
	var rev int64
	for i := range 3 {
		resp, err := ca.Put(ctx, "/clients-test/compacted", strconv.Itoa(i))
		if err != nil {
			t.Fatal(err)
		}
		rev = resp.Header.Revision
	}
	if _, err := ca.Compact(ctx, rev); err != nil {
		t.Fatal(err)
	}
	f.compactedA = rev
	args := []string{"--cluster", "a=" + a.Endpoints()[0], "--cluster", "b=" + b.Endpoints()[0]}
	f.m1, f.m2 = startServe(t, args...), startServe(t, args...)
	return f
}

func (c *clusterFleet) env() []string {
	return []string{
		"STOCKCTL_MERGED_TARGET=" + c.m1.API,
		"STOCKCTL_MERGED_SPARE_TARGET=" + c.m2.API,
		"STOCKCTL_MERGED_SPARE_PID=" + strconv.Itoa(c.m2.cmd.Process.Pid),
		"STOCKCTL_MERGED_SKU_A=" + c.skuA,
		"STOCKCTL_MERGED_SKU_B=" + c.skuB,
		"STOCKCTL_MERGED_COMPACTED_A=" + strconv.FormatInt(c.compactedA, 10),
	}
}

func newFleet(t *testing.T) *fleet {
	t.Helper()
	a := startServe(t)
	b := startServe(t, "--endpoints", strings.Join(a.Etcd, ","))
	cli, err := clientv3.New(clientv3.Config{Endpoints: a.Etcd, DialTimeout: procBound})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), procBound)
	defer cancel()
	var rev int64
	for i := range 3 {
		resp, err := cli.Put(ctx, "/clients-test/compacted", strconv.Itoa(i))
		if err != nil {
			t.Fatal(err)
		}
		rev = resp.Header.Revision
	}
	if _, err := cli.Compact(ctx, rev); err != nil {
		t.Fatal(err)
	}
	return &fleet{a: a, b: b, compacted: rev, pruned: prunedOrder(ctx, t, cli), clusters: newClusterFleet(t)}
}

// prunedOrder creates a SKU with one order, "gone", which it prunes (the
// API has no prune: operators run `stockctl prune`), and returns the SKU:
// the clients' suites check that a retry of it is refused (ORDER_PRUNED).
func prunedOrder(ctx context.Context, t *testing.T, cli *clientv3.Client) string {
	t.Helper()
	c, err := coordinator.New(cli)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	const sku = "clients-pruned"
	if _, err := c.CreateSKU(ctx, sku, coordinator.SKUConfig{Total: 5, Segments: 1, InitialFill: 5}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Allocate(ctx, sku, "gone", 1, ""); err != nil {
		t.Fatal(err)
	}
	if p, err := c.Prune(ctx, sku, time.Now().Add(time.Hour)); err != nil || p.Orders != 1 {
		t.Fatalf("prune: %+v, %v", p, err)
	}
	return sku
}

func (f *fleet) env() []string {
	env := append(os.Environ(), f.clusters.env()...)
	return append(env,
		"STOCKCTL_TARGET="+f.a.API,
		"STOCKCTL_SPARE_TARGET="+f.b.API,
		"STOCKCTL_SPARE_PID="+strconv.Itoa(f.b.cmd.Process.Pid),
		"STOCKCTL_TOKEN="+token,
		"STOCKCTL_COMPACTED="+strconv.FormatInt(f.compacted, 10),
		"STOCKCTL_PRUNED_SKU="+f.pruned,
	)
}

// run runs name with args in dir and env, and returns its combined output.
func run(t *testing.T, dir string, env []string, name string, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir, cmd.Env = dir, env
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// docBlock returns the fenced code block of docs/api.md that follows the
// line `<!-- program: NAME -->`.
func docBlock(t *testing.T, name string) string {
	t.Helper()
	raw, err := os.ReadFile("../docs/api.md")
	if err != nil {
		t.Fatal(err)
	}
	marker := "<!-- program: " + name + " -->\n"
	_, rest, ok := strings.Cut(string(raw), marker)
	if !ok {
		t.Fatalf("docs/api.md has no %q", strings.TrimSpace(marker))
	}
	_, rest, ok = strings.Cut(rest, "\n") // the ```lang line
	block, _, ok2 := strings.Cut(rest, "\n```\n")
	if !ok || !ok2 {
		t.Fatalf("docs/api.md: no code block after %q", strings.TrimSpace(marker))
	}
	return block + "\n"
}

// sameAsDoc fails t unless the file is docs/api.md's program NAME.
func sameAsDoc(t *testing.T, name, file string) {
	t.Helper()
	raw, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	if doc := docBlock(t, name); doc != string(raw) {
		t.Errorf("docs/api.md's program %q is not %s: copy the file into the doc", name, file)
	}
}
