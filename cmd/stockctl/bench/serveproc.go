package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Serve says how StockctlAPI runs its `stockctl serve` processes.
type Serve struct {
	// Binary is the stockctl executable (the running one, for stockctl
	// bench).
	Binary string
	// Env is added to each process's environment: how it reaches the
	// bench's etcd (STOCKCTL_CACERT, STOCKCTL_CERT, STOCKCTL_KEY,
	// STOCKCTL_USER), kept out of its command line. The bench's own
	// STOCKCTL_* variables are not passed on, so that none (an API token
	// file, another prefix) changes what is measured.
	Env []string
}

// serveStopGrace bounds a serve process's graceful stop (SIGTERM) before it
// is killed: a little more than the service's shutdown grace.
const serveStopGrace = 15 * time.Second

// serveOutputCap bounds what is kept of a serve process's stderr.
const serveOutputCap = 64 << 10

// serveProcess is one `stockctl serve` OS process of a run.
type serveProcess struct {
	cmd    *exec.Cmd
	out    capBuffer // stdout: the first line says where the API is
	errOut capBuffer // stderr: warnings are the run's problems
	exited chan struct{}
	api    string // base URL, http://127.0.0.1:port
}

// startServe starts `stockctl serve` on the etcd endpoints under prefix,
// its API on a free loopback port, its rebalancer named identity, and
// returns once it says where its API is (bounded by ctx; on failure the
// process is killed).
func startServe(ctx context.Context, s Serve, endpoints []string, prefix, identity string) (*serveProcess, error) {
	p := &serveProcess{exited: make(chan struct{})}
	p.out.cap, p.errOut.cap = serveOutputCap, serveOutputCap
	p.cmd = exec.Command(s.Binary, "-o", "json", "--endpoints", strings.Join(endpoints, ","), "--prefix", prefix, "--log-level", "warn",
		"serve", "--api-addr", "127.0.0.1:0", "--identity", identity)
	p.cmd.Env = append(withoutStockctlEnv(os.Environ()), s.Env...)
	p.cmd.Stdout, p.cmd.Stderr = &p.out, &p.errOut
	setDeathSignal(p.cmd)
	if err := p.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s serve: %w", s.Binary, err)
	}
	go func() { _ = p.cmd.Wait(); close(p.exited) }()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		line, _, ok := strings.Cut(p.out.String(), "\n")
		var first struct {
			API string `json:"api"`
		}
		if ok && json.Unmarshal([]byte(line), &first) == nil && first.API != "" {
			p.api = first.API
			return p, nil
		}
		select {
		case <-p.exited:
			return nil, fmt.Errorf("stockctl serve %s exited (%v) before serving: %s", identity, p.cmd.ProcessState, strings.TrimSpace(p.errOut.String()))
		case <-ctx.Done():
			p.kill()
			return nil, fmt.Errorf("stockctl serve %s did not say where its API is: %w", identity, context.Cause(ctx))
		case <-tick.C:
		}
	}
}

// withoutStockctlEnv is env without its STOCKCTL_* variables.
func withoutStockctlEnv(env []string) []string {
	var out []string
	for _, kv := range env {
		if !strings.HasPrefix(kv, "STOCKCTL_") {
			out = append(out, kv)
		}
	}
	return out
}

// stop stops the process gracefully (SIGTERM), killing it after
// serveStopGrace, and returns what went wrong: a kill, or an exit code
// other than 0.
func (p *serveProcess) stop() error {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
	case <-time.After(serveStopGrace):
		p.kill()
		return fmt.Errorf("did not stop within %v of SIGTERM: killed", serveStopGrace)
	}
	if code := p.cmd.ProcessState.ExitCode(); code != 0 {
		return fmt.Errorf("exited %d on SIGTERM: %s", code, strings.TrimSpace(p.errOut.String()))
	}
	return nil
}

// kill kills the process if it runs, and waits for it.
func (p *serveProcess) kill() {
	_ = p.cmd.Process.Kill()
	<-p.exited
}

// warnings are the lines of the process's stderr at warn level or above.
func (p *serveProcess) warnings() []string {
	var w []string
	for _, line := range strings.Split(p.errOut.String(), "\n") {
		if strings.HasPrefix(line, "stockctl: warn: ") || strings.HasPrefix(line, "stockctl: error: ") {
			w = append(w, line)
		}
	}
	return w
}

// capBuffer keeps the first cap bytes written to it, for a process's
// output; it is safe for the process's copying goroutine and readers.
type capBuffer struct {
	mu  sync.Mutex
	b   bytes.Buffer
	cap int
}

func (c *capBuffer) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if room := c.cap - c.b.Len(); room > 0 {
		c.b.Write(p[:min(len(p), room)])
	}
	return len(p), nil
}

func (c *capBuffer) String() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.b.String()
}
