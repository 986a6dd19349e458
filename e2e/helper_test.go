package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/stockctl/stockctl/coordinator"
	"github.com/stockctl/stockctl/internal/engines"
	"github.com/stockctl/stockctl/rebalance"
	"github.com/stockctl/stockctl/segments"
)

// helperEnv, when set in the environment of this test binary, makes it run
// as a helper process instead of the tests. Its value is a JSON helperConfig.
const helperEnv = "STOCKCTL_E2E_HELPER"

// helperConfig tells a helper process what to do.
type helperConfig struct {
	// Mode is "alloc" (hold segment locks, allocate in a loop) or
	// "rebalance" (run an elected rebalancer).
	Mode      string
	Endpoints []string
	// SecondEndpoints, if set, makes the helper a coordinator over two
	// clusters (coordinator.NewClusters): "first" on Endpoints, "second"
	// on these.
	SecondEndpoints []string
	TTLSec          int
	SKU             string
	// Hold lists home segments of AllocateFuncs whose business step never
	// returns ("HOLD <seg> <order>" once it runs): each holds a segment's
	// lock, not necessarily its home's (the helper prints "LEASE <hex>" first,
	// so the test can see which segments its lease holds).
	Hold []int
	// Churn lists route keys; for each, a goroutine allocates one order
	// after another, printing "SENT <order> <qty>" before and "ACK <order>
	// <rev>" after each.
	Churn    []string
	Identity string
	// Permit mode: Permits goroutines each take a permit of semaphore Sem
	// (limit Limit), put a history marker under Markers (lease-bound,
	// fenced), print "HOLD <marker>" and hold until killed.
	Sem     string
	Limit   int
	Permits int
	Markers string
	// MaxLifeSec bounds the helper's life: it exits by itself if nobody
	// killed it by then.
	MaxLifeSec int
	// Xcart mode (over two clusters): each Churn route places orders of
	// two lines, Lines[0] (a SKU of the first cluster) and Lines[1] (of the
	// second), with a reservation TTL of AcrossTTLMs between the reserves
	// and the confirms.
	Lines       []string
	AcrossTTLMs int
}

// helperMain runs a helper process and returns its exit code.
func helperMain() int {
	var cfg helperConfig
	if err := json.Unmarshal([]byte(os.Getenv(helperEnv)), &cfg); err != nil {
		fmt.Fprintln(os.Stderr, "helper: bad config:", err)
		return 2
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Duration(cfg.MaxLifeSec)*time.Second)
	defer cancel()
	cli, err := clientv3.New(clientv3.Config{Endpoints: cfg.Endpoints, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		fmt.Fprintln(os.Stderr, "helper: client:", err)
		return 2
	}
	defer cli.Close()
	var c *coordinator.Coordinator
	if len(cfg.SecondEndpoints) > 0 {
		cli2, cerr := clientv3.New(clientv3.Config{Endpoints: cfg.SecondEndpoints, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
		if cerr != nil {
			fmt.Fprintln(os.Stderr, "helper: client:", cerr)
			return 2
		}
		defer cli2.Close()
		opts := []coordinator.Option{coordinator.WithSessionTTL(time.Duration(cfg.TTLSec) * time.Second)}
		if cfg.AcrossTTLMs > 0 {
			opts = append(opts, coordinator.WithAcrossTTL(time.Duration(cfg.AcrossTTLMs)*time.Millisecond))
		}
		c, err = coordinator.NewClusters(ctx, []coordinator.Cluster{{Name: "first", Client: cli}, {Name: "second", Client: cli2}}, opts...)
	} else {
		c, err = coordinator.New(cli, coordinator.WithSessionTTL(time.Duration(cfg.TTLSec)*time.Second))
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "helper: coordinator:", err)
		return 2
	}
	defer c.Close()
	out := &lineWriter{}
	switch cfg.Mode {
	case "alloc":
		helperAlloc(ctx, c, cfg, out)
	case "rebalance":
		helperRebalance(ctx, c, cfg, out)
	case "permit":
		helperPermit(ctx, c, cfg, out)
	case "xcart":
		helperXcart(ctx, c, cfg, out)
	default:
		fmt.Fprintln(os.Stderr, "helper: unknown mode", cfg.Mode)
		return 2
	}
	fmt.Fprintln(os.Stderr, "helper: nobody killed me within my life time")
	return 3
}

// lineWriter writes whole lines to stdout, unbuffered, one at a time, so
// that what a SIGKILL cuts off is whole lines.
type lineWriter struct{ mu sync.Mutex }

func (w *lineWriter) printf(format string, args ...any) {
	w.mu.Lock()
	defer w.mu.Unlock()
	fmt.Fprintf(os.Stdout, format+"\n", args...)
}

func helperAlloc(ctx context.Context, c *coordinator.Coordinator, cfg helperConfig, out *lineWriter) {
	in := c // the coordinator of the SKU's cluster: its lease holds the SKU's locks
	if c.Clusters() != nil {
		where, err := c.ClusterOf(ctx, cfg.SKU)
		if err != nil {
			fmt.Fprintln(os.Stderr, "helper: cluster of the SKU:", err)
			return
		}
		in = c.Cluster(where)
	}
	meta, _, err := engines.Of(in).Stock.Meta(ctx, cfg.SKU)
	if err != nil {
		fmt.Fprintln(os.Stderr, "helper: meta:", err)
		return
	}
	sess, err := engines.Of(in).Locks.Session(ctx)
	if err != nil {
		fmt.Fprintln(os.Stderr, "helper: session:", err)
		return
	}
	out.printf("LEASE %x", int64(sess.Lease()))
	var wg sync.WaitGroup
	for _, seg := range cfg.Hold {
		route := ""
		for i := 0; route == ""; i++ {
			if k := fmt.Sprintf("holder-%d", i); segments.Route(k, meta.Segments) == seg {
				route = k
			}
		}
		order := fmt.Sprintf("hold-%d", seg)
		wg.Go(func() {
			_, err := c.AllocateFunc(ctx, cfg.SKU, order, 1, route, func(sctx context.Context) error {
				out.printf("HOLD %d %s", seg, order)
				<-sctx.Done() // a long business step: only the kill ends it
				return sctx.Err()
			})
			fmt.Fprintln(os.Stderr, "helper: hold ended:", err)
		})
	}
	for _, route := range cfg.Churn {
		wg.Go(func() {
			for n := 0; n < 100_000 && ctx.Err() == nil; n++ {
				order := fmt.Sprintf("churn-%s-%d", route, n)
				qty := int64(1 + n%3)
				out.printf("SENT %s %d", order, qty)
				actx, cancel := context.WithTimeout(ctx, 5*time.Second)
				a, err := c.Allocate(actx, cfg.SKU, order, qty, route)
				cancel()
				if err != nil {
					out.printf("ERR %s %v", order, strings.ReplaceAll(err.Error(), "\n", " "))
					continue
				}
				out.printf("ACK %s %d", order, a.Revision)
			}
		})
	}
	wg.Wait()
}

func helperRebalance(ctx context.Context, c *coordinator.Coordinator, cfg helperConfig, out *lineWriter) {
	r, err := rebalance.New(c, rebalance.Config{
		Identity:      cfg.Identity,
		SweepInterval: 200 * time.Millisecond,
		OnMove: func(m rebalance.Move) {
			out.printf("MOVE %s %d %s %d %d %s", m.SKU, m.Segment, m.Kind, m.Qty, m.Revision, m.Leader)
		},
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "helper: rebalancer:", err)
		return
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = r.Run(ctx)
	}()
	leader := false
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-done:
			return
		case <-tick.C:
			if l := r.Leader(); l != leader {
				leader = l
				out.printf("LEADER %v", l)
			}
		}
	}
}

// helperProc is a running helper process, seen from the test.
type helperProc struct {
	cmd    *exec.Cmd
	stderr bytes.Buffer
	mu     sync.Mutex
	lines  []string
	exited chan struct{} // closed when stdout is closed and the process reaped
}

// startHelper starts this test binary as a helper process with cfg. It is
// SIGKILLed at cleanup if still running.
func startHelper(t testing.TB, cfg helperConfig) *helperProc {
	t.Helper()
	if cfg.MaxLifeSec == 0 {
		cfg.MaxLifeSec = 120
	}
	b, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	p := &helperProc{exited: make(chan struct{})}
	p.cmd = exec.Command(os.Args[0], "-test.run=^$")
	p.cmd.Env = append(os.Environ(), helperEnv+"="+string(b))
	p.cmd.Stderr = &p.stderr
	setDeathSignal(p.cmd)
	stdout, err := p.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("start helper: %v", err)
	}
	go func() {
		defer close(p.exited)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			p.mu.Lock()
			p.lines = append(p.lines, sc.Text())
			p.mu.Unlock()
		}
		_ = p.cmd.Wait()
	}()
	t.Cleanup(func() {
		_ = p.cmd.Process.Kill()
		<-p.exited
		if t.Failed() {
			t.Logf("helper %s stderr:\n%s", cfg.Mode, p.stderr.String())
		}
	})
	return p
}

// Lines returns the lines the helper printed so far.
func (p *helperProc) Lines() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.lines...)
}

// count returns how many printed lines start with prefix.
func (p *helperProc) count(prefix string) int {
	n := 0
	for _, l := range p.Lines() {
		if strings.HasPrefix(l, prefix) {
			n++
		}
	}
	return n
}

// kill SIGKILLs the helper, waits until it is reaped and returns the time
// the signal was sent.
func (p *helperProc) kill(t testing.TB) time.Time {
	t.Helper()
	at := time.Now()
	if err := p.cmd.Process.Kill(); err != nil {
		t.Fatalf("kill helper: %v", err)
	}
	select {
	case <-p.exited:
	case <-time.After(10 * time.Second):
		t.Fatal("helper not reaped 10s after SIGKILL")
	}
	if st := p.cmd.ProcessState; st == nil || st.Exited() {
		t.Fatalf("helper was not killed by the signal: %v (stderr: %s)", st, p.stderr.String())
	}
	return at
}
