package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stockctl/stockctl/internal/etcdtest"
)

// procBound bounds every wait on a serve process: only there to turn a
// hang into a failure on a loaded machine.
const procBound = 90 * time.Second

// builtStockctl is the stockctl binary of this tree, built once per test
// binary into the package's temporary directory (removed by TestMain).
var builtStockctl struct {
	once sync.Once
	path string
	err  error
}

// stockctlBinary builds the stockctl binary (once), as a person would
// before running it.
func stockctlBinary(t *testing.T) string {
	t.Helper()
	builtStockctl.once.Do(func() {
		goBin, err := exec.LookPath("go")
		if err != nil {
			goBin = filepath.Join(goRoot(), "bin", "go")
		}
		dir, err := os.MkdirTemp(testTempDir, "bin-")
		if err != nil {
			builtStockctl.err = err
			return
		}
		bin := filepath.Join(dir, "stockctl")
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		out, err := exec.CommandContext(ctx, goBin, "build", "-o", bin, "github.com/stockctl/stockctl/cmd/stockctl").CombinedOutput()
		if err != nil {
			builtStockctl.err = fmt.Errorf("go build stockctl: %v: %s", err, out)
			return
		}
		builtStockctl.path = bin
	})
	if builtStockctl.err != nil {
		t.Fatal(builtStockctl.err)
	}
	return builtStockctl.path
}

// serveProc is a `stockctl serve` OS process of the built binary.
type serveProc struct {
	cmd         *exec.Cmd
	out, errOut syncBuffer
	exited      chan struct{}
	waitErr     error
	view        serveView // its first line: where its API and etcd are
}

// startServeProc runs the built stockctl with -o json and args (global
// flags, "serve", serve's flags) and returns once serve said where its API
// is. At cleanup a process still running is interrupted (SIGTERM), and
// must exit 0.
func startServeProc(t *testing.T, args ...string) *serveProc {
	t.Helper()
	p := &serveProc{exited: make(chan struct{})}
	p.cmd = exec.Command(stockctlBinary(t), append([]string{"-o", "json"}, args...)...)
	p.cmd.Stdout, p.cmd.Stderr = &p.out, &p.errOut
	// The kernel kills serve if the test binary dies without cleaning up.
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("start stockctl serve: %v", err)
	}
	go func() { p.waitErr = p.cmd.Wait(); close(p.exited) }()
	t.Cleanup(func() {
		select {
		case <-p.exited:
			return
		default:
		}
		if code := p.term(); code != 0 {
			t.Errorf("stockctl serve exited %d when interrupted; stderr:\n%s", code, p.errOut.String())
		}
	})
	etcdtest.WaitFor(t, "stockctl serve to say where its API is", procBound, func() bool {
		select {
		case <-p.exited:
			t.Fatalf("stockctl %s exited: %v; stderr:\n%s", strings.Join(args, " "), p.waitErr, p.errOut.String())
		default:
		}
		line, _, ok := strings.Cut(p.out.String(), "\n")
		return ok && json.Unmarshal([]byte(line), &p.view) == nil && p.view.API != ""
	})
	return p
}

// term interrupts serve (SIGTERM, as systemd stops it) and returns its
// exit code; a process that does not stop within procBound is killed
// and reported as -1.
func (p *serveProc) term() int {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
	case <-time.After(procBound):
		_ = p.cmd.Process.Kill()
		<-p.exited
		return -1
	}
	return p.cmd.ProcessState.ExitCode()
}

// curlCall POSTs body as JSON to the API's method (e.g.
// "stockctl.v1.StockService/Allocate") with curl, with the bearer token
// if not empty, and curl's extra arguments, and returns the HTTP status and
// the decoded answer.
func curlCall(t *testing.T, api, method, token, body string, extra ...string) (int, map[string]any) {
	t.Helper()
	args := []string{"-sS", "--max-time", strconv.Itoa(int(procBound / time.Second)), "-X", "POST",
		"-H", "Content-Type: application/json", "-w", "\n%{http_code}", "-d", body}
	if token != "" {
		args = append(args, "-H", "Authorization: Bearer "+token)
	}
	args = append(args, extra...)
	out, err := exec.Command("curl", append(args, api+"/"+method)...).Output()
	if err != nil {
		t.Fatalf("curl %s: %v: %s", method, err, out)
	}
	i := bytes.LastIndexByte(out, '\n')
	code, err := strconv.Atoi(string(out[i+1:]))
	if i < 0 || err != nil {
		t.Fatalf("curl %s: no status in %q", method, out)
	}
	var doc map[string]any
	if err := json.Unmarshal(out[:i], &doc); err != nil {
		t.Fatalf("curl %s: %v: %s", method, err, out)
	}
	return code, doc
}

// needCurl skips t without curl on PATH.
func needCurl(t *testing.T) {
	t.Helper()
	if _, err := exec.LookPath("curl"); err != nil {
		t.Skip("no curl on PATH")
	}
}
