package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stockctl/stockctl/internal/etcdtest"
)

// serveBound bounds each wait on a serve process: only there to turn a hang
// into a failure on a loaded machine.
const serveBound = 90 * time.Second

// buildStockctl builds the stockctl binary of this tree into a directory of
// the test's, as a person would before running it.
func buildStockctl(t testing.TB) string {
	t.Helper()
	goBin, err := exec.LookPath("go")
	if err != nil {
		goBin = filepath.Join(os.Getenv("GOROOT"), "bin", "go")
	}
	bin := filepath.Join(t.TempDir(), "stockctl")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if out, err := exec.CommandContext(ctx, goBin, "build", "-o", bin, "github.com/stockctl/stockctl/cmd/stockctl").CombinedOutput(); err != nil {
		t.Fatalf("go build stockctl: %v: %s", err, out)
	}
	return bin
}

// syncBuffer is a bytes.Buffer safe for a process's output and the test.
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

// serveProc is a `stockctl serve --endpoints ...` OS process.
type serveProc struct {
	name        string
	cmd         *exec.Cmd
	out, errOut syncBuffer
	exited      chan struct{}
	api         string // the API's base URL, from serve's first line
}

// startServe runs `stockctl serve` of bin on etcd's endpoints, its API on a
// free loopback port, and returns once it said where its API is. At
// cleanup a process still running is SIGKILLed.
func startServe(t testing.TB, bin string, endpoints []string, name string) *serveProc {
	t.Helper()
	p := &serveProc{name: name, exited: make(chan struct{})}
	p.cmd = exec.Command(bin, "-o", "json", "--endpoints", strings.Join(endpoints, ","),
		"serve", "--api-addr", "127.0.0.1:0", "--identity", name)
	p.cmd.Stdout, p.cmd.Stderr = &p.out, &p.errOut
	setDeathSignal(p.cmd)
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	go func() { _ = p.cmd.Wait(); close(p.exited) }()
	t.Cleanup(func() {
		_ = p.cmd.Process.Kill()
		<-p.exited
		if t.Failed() {
			t.Logf("%s stderr:\n%s", name, p.errOut.String())
		}
	})
	etcdtest.WaitFor(t, name+" to say where its API is", serveBound, func() bool {
		select {
		case <-p.exited:
			t.Fatalf("%s exited: %v; stderr:\n%s", name, p.cmd.ProcessState, p.errOut.String())
		default:
		}
		var first struct {
			API string `json:"api"`
		}
		line, _, ok := strings.Cut(p.out.String(), "\n")
		if ok && json.Unmarshal([]byte(line), &first) == nil {
			p.api = first.API
		}
		return p.api != ""
	})
	return p
}

// kill SIGKILLs the process and waits until it is reaped.
func (p *serveProc) kill(t testing.TB) {
	t.Helper()
	if err := p.cmd.Process.Kill(); err != nil {
		t.Fatalf("kill %s: %v", p.name, err)
	}
	<-p.exited
	if st := p.cmd.ProcessState; st == nil || st.Exited() {
		t.Fatalf("%s was not killed by the signal: %v", p.name, st)
	}
}

// term stops the process with SIGTERM, as systemd does; it must exit 0.
func (p *serveProc) term(t testing.TB) {
	t.Helper()
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
	case <-time.After(serveBound):
		t.Fatalf("%s did not stop within %v of SIGTERM", p.name, serveBound)
	}
	if code := p.cmd.ProcessState.ExitCode(); code != 0 {
		t.Fatalf("%s exited %d on SIGTERM; stderr:\n%s", p.name, code, p.errOut.String())
	}
}
