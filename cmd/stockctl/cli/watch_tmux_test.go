//go:build linux

package cli

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stockctl/stockctl/internal/etcdtest"
)

// A person's view of status --watch: the built stockctl, drawn in a real
// terminal (a tmux pane), against a running `stockctl serve` while a sale
// runs through `stockctl allocate`. The test reads the pane as a person
// would, with tmux capture-pane, and ends the watch with ^C.
func TestStatusWatchInTmux(t *testing.T) {
	t.Parallel()
	tmux := findTmux(t)
	bin := buildStockctl(t)
	addr := freeAddr(t)
	base := append(os.Environ(), "LANG=C.UTF-8")
	startServeProcess(t, bin, base, addr)
	env := append(base, "STOCKCTL_ENDPOINTS=http://"+addr)

	stockctl := func(args ...string) (string, int) {
		cmd := exec.Command(bin, args...)
		cmd.Env = env
		out, err := cmd.CombinedOutput()
		var exit *exec.ExitError
		switch {
		case errors.As(err, &exit):
			return string(out), exit.ExitCode()
		case err != nil:
			t.Errorf("stockctl %v: %v", args, err)
			return string(out), -1
		}
		return string(out), 0
	}
	if out, code := stockctl("init", "phone", "--total", "300", "--segments", "4", "--initial-fill", "40",
		"--low-watermark", "5", "--refill-batch", "10"); code != 0 {
		t.Fatalf("init: exit %d: %s", code, out)
	}

	pane := newTmuxPane(t, tmux, env, fmt.Sprintf("%q status phone --watch", bin))
	first := pane.waitFor("the first frame", func(s screen) bool {
		return strings.Contains(s.text, "SKU        phone") && strings.Contains(s.text, "LEADER     tmux-rebalancer (lease ") &&
			len(s.segments) == 4
	})
	if first.pool != 260 || first.allocated != 0 || first.total != 300 || strings.Contains(first.text, "\x1b") {
		t.Fatalf("first frame:\n%s", first.text)
	}

	// The sale: three buyers, each a loop of `stockctl allocate`, until
	// stockctl says the SKU is sold out (exit 3). Meanwhile the pane is
	// read again and again: each screen must balance, and the numbers
	// must move.
	var wg sync.WaitGroup
	saleDone := make(chan struct{})
	for b := range 3 {
		wg.Go(func() {
			for i := 0; ; i++ {
				out, code := stockctl("allocate", "phone", "--order", fmt.Sprintf("b%d-%d", b, i), "--qty", fmt.Sprint(1+i%3),
					"--route-key", fmt.Sprintf("buyer-%d", b))
				switch {
				case code == ExitInsufficientStock && i%3 > 0:
					i = i - i%3 + 2 // a smaller order may still be served: try 1 unit next
				case code == ExitInsufficientStock:
					return
				case code != 0:
					t.Errorf("allocate: exit %d: %s", code, out)
					return
				}
			}
		})
	}
	go func() { wg.Wait(); close(saleDone) }()
	var seen []screen
	for selling := true; selling; {
		select {
		case <-saleDone:
			selling = false
		case <-time.After(150 * time.Millisecond):
		}
		s := pane.capture()
		if len(s.segments) == 4 && (len(seen) == 0 || s.stock() != seen[len(seen)-1].stock()) {
			seen = append(seen, s)
		}
	}
	if t.Failed() {
		return
	}
	last := pane.waitFor("the sold-out SKU", func(s screen) bool { return s.pool == 0 && s.allocated == 300 })
	for _, s := range append(seen, last) {
		if sum := s.pool + s.allocated + s.segmentSum(); s.total != 300 || sum != 300 {
			t.Fatalf("a screen whose books do not balance (total %d, pool + segments + allocated = %d):\n%s", s.total, sum, s.text)
		}
	}
	// What changed on the screen as the sale ran: frames between the
	// first and the last, with other numbers in the segment rows.
	between := 0
	for _, s := range seen {
		if s.allocated > 0 && s.allocated < 300 && s.stock() != first.stock() {
			between++
		}
	}
	if between < 2 {
		t.Fatalf("%d screens during the sale; first:\n%s\nlast:\n%s", between, first.text, last.text)
	}
	if !strings.Contains(last.text, "LAST PASS") || !strings.Contains(last.text, "by tmux-rebalancer") {
		t.Errorf("the last screen does not show the rebalancer's pass:\n%s", last.text)
	}
	if !strings.Contains(first.text, "\n0        10         0      "+strings.Repeat("█", barWidth)+"\n") {
		t.Errorf("no full segment bar on the first screen:\n%s", first.text)
	}
	t.Logf("a screen during the sale:\n%s", seen[len(seen)/2].text)

	pane.keys("C-c")
	pane.waitFor("stockctl to exit", func(s screen) bool { return strings.Contains(s.text, "stockctl exited with status") })
	if s := pane.capture(); !strings.Contains(s.text, "stockctl exited with status 0") {
		t.Fatalf("after ^C:\n%s", s.text)
	}
}

// screen is what a tmux pane shows, and the figures read from it.
type screen struct {
	text                   string
	total, pool, allocated int64
	segments               [][2]int64 // remaining, inbox of each segment row
}

var (
	kvLine     = regexp.MustCompile(`(?m)^(TOTAL|POOL|ALLOCATED) +(\d+)`)
	segmentRow = regexp.MustCompile(`(?m)^(\d+) +(\d+) +(\d+)`)
)

func parseScreen(text string) screen {
	s := screen{text: text}
	for _, m := range kvLine.FindAllStringSubmatch(text, -1) {
		n, _ := strconv.ParseInt(m[2], 10, 64)
		switch m[1] {
		case "TOTAL":
			s.total = n
		case "POOL":
			s.pool = n
		case "ALLOCATED":
			s.allocated = n
		}
	}
	for _, m := range segmentRow.FindAllStringSubmatch(text, -1) {
		r, _ := strconv.ParseInt(m[2], 10, 64)
		in, _ := strconv.ParseInt(m[3], 10, 64)
		s.segments = append(s.segments, [2]int64{r, in})
	}
	return s
}

func (s screen) segmentSum() int64 {
	var n int64
	for _, seg := range s.segments {
		n += seg[0]
	}
	return n
}

// stock is the screen's figures, to tell screens apart by what they show.
func (s screen) stock() string { return fmt.Sprint(s.pool, s.allocated, s.segments) }

// tmuxPane is one detached tmux session on a server of the test's own.
type tmuxPane struct {
	t    *testing.T
	tmux string
	sock string
	env  []string
}

// newTmuxPane runs command (a shell command line) in a new 100×40 pane.
// When it exits, the pane says with what status and stays.
func newTmuxPane(t *testing.T, tmux string, env []string, command string) *tmuxPane {
	t.Helper()
	p := &tmuxPane{t: t, tmux: tmux, sock: filepath.Join(t.TempDir(), "tmux.sock"), env: env}
	t.Cleanup(func() { _, _ = p.run("kill-server") })
	shell := command + `; echo "stockctl exited with status $?"; exec sleep 600`
	if out, err := p.run("-f", "/dev/null", "new-session", "-d", "-s", "watch", "-x", "100", "-y", "40", shell); err != nil {
		t.Fatalf("tmux new-session: %v: %s", err, out)
	}
	return p
}

func (p *tmuxPane) run(args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, p.tmux, append([]string{"-u", "-S", p.sock}, args...)...)
	cmd.Env = p.env
	out, err := cmd.CombinedOutput()
	return string(out), err
}

func (p *tmuxPane) capture() screen {
	p.t.Helper()
	out, err := p.run("capture-pane", "-p", "-t", "watch")
	if err != nil {
		p.t.Fatalf("tmux capture-pane: %v: %s", err, out)
	}
	return parseScreen(out)
}

func (p *tmuxPane) keys(keys ...string) {
	p.t.Helper()
	if out, err := p.run(append([]string{"send-keys", "-t", "watch"}, keys...)...); err != nil {
		p.t.Fatalf("tmux send-keys: %v: %s", err, out)
	}
}

// waitFor reads the pane until cond holds, failing the test after a
// generous bound (the machine may be slow), with the pane in the message.
func (p *tmuxPane) waitFor(what string, cond func(screen) bool) screen {
	p.t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		s := p.capture()
		if cond(s) {
			return s
		}
		if time.Now().After(deadline) {
			p.t.Fatalf("timed out waiting for %s; the pane shows:\n%s", what, s.text)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// startServeProcess runs the built `stockctl serve` on addr with a data dir of the test's,
// until the test ends (^C, as a person stops it).
func startServeProcess(t *testing.T, bin string, env []string, addr string) {
	t.Helper()
	var out, errOut syncBuffer
	cmd := exec.Command(bin, "--data-dir", filepath.Join(t.TempDir(), "served.etcd"), "serve", "--listen", addr,
		"--api-addr", "127.0.0.1:0", "--identity", "tmux-rebalancer")
	cmd.Env, cmd.Stdout, cmd.Stderr = env, &out, &errOut
	// The kernel kills serve if the test binary dies without cleaning up.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start stockctl serve: %v", err)
	}
	exited := make(chan struct{})
	var waitErr error
	go func() { waitErr = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(os.Interrupt)
		select {
		case <-exited:
			if waitErr != nil {
				t.Errorf("stockctl serve: %v; stderr:\n%s", waitErr, errOut.String())
			}
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
			t.Errorf("stockctl serve did not stop on ^C; stderr:\n%s", errOut.String())
		}
	})
	etcdtest.WaitFor(t, "stockctl serve to start", 60*time.Second, func() bool {
		select {
		case <-exited:
			t.Fatalf("stockctl serve exited: %v; stderr:\n%s", waitErr, errOut.String())
		default:
		}
		return strings.Contains(out.String(), "export STOCKCTL_ENDPOINTS=http://"+addr)
	})
}

// buildStockctl builds the stockctl binary of this tree into a directory
// of the test's, as a person would before running it.
func buildStockctl(t *testing.T) string {
	t.Helper()
	goBin, err := exec.LookPath("go")
	if err != nil {
		goBin = filepath.Join(goRoot(), "bin", "go")
	}
	bin := filepath.Join(t.TempDir(), "stockctl")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, goBin, "build", "-o", bin, "github.com/stockctl/stockctl/cmd/stockctl")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build stockctl: %v: %s", err, out)
	}
	return bin
}

// goRoot is where go test's own toolchain lives, for a PATH without go.
func goRoot() string {
	if r := os.Getenv("GOROOT"); r != "" {
		return r
	}
	out, err := exec.Command("go", "env", "GOROOT").Output()
	if err != nil {
		return "/usr/local/go"
	}
	return strings.TrimSpace(string(out))
}

// findTmux returns tmux's path. Without one, it installs Debian's tmux
// package (as root, or through sudo without a password), once per test
// binary; when that cannot be done the test is skipped, saying why.
func findTmux(t *testing.T) string {
	t.Helper()
	if p, err := exec.LookPath("tmux"); err == nil {
		return p
	}
	p, why := installTmuxOnce()
	if p == "" {
		t.Skipf("tmux is needed to test status --watch in a terminal: %s. Install it (Debian/Ubuntu: apt-get install tmux)", why)
	}
	return p
}

var installTmuxOnce = sync.OnceValues(installTmux)

// tmuxInstallLock is the file lock etcdtest takes around its apt-get
// (internal/etcdtest installLock): two apt-gets at once fail on dpkg's
// lock instead of waiting, and go test runs several test binaries at once.
const tmuxInstallLock = "stockctl-etcdtest-install.lock"

func installTmux() (path, why string) {
	var sudo []string
	if os.Geteuid() != 0 {
		if _, err := exec.LookPath("sudo"); err != nil {
			return "", "tmux is not on PATH, and installing it needs root or sudo"
		}
		sudo = []string{"sudo", "-n"} // never a password prompt: a test cannot answer it
	}
	if _, err := exec.LookPath("apt-get"); err != nil {
		return "", "tmux is not on PATH, and there is no apt-get to install it with"
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	f, err := os.OpenFile(filepath.Join(os.TempDir(), tmuxInstallLock), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return "", fmt.Sprintf("tmux is not on PATH: open the install lock: %v", err)
	}
	defer f.Close()
	for {
		// Non-blocking attempts, so that the wait ends with ctx.
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			break
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) && !errors.Is(err, syscall.EINTR) {
			return "", fmt.Sprintf("tmux is not on PATH: take the install lock: %v", err)
		}
		select {
		case <-ctx.Done():
			return "", "tmux is not on PATH, and another install held the lock for 4 minutes"
		case <-time.After(100 * time.Millisecond):
		}
	}
	if p, err := exec.LookPath("tmux"); err == nil {
		return p, "" // installed by another test binary while we waited
	}
	apt := func(args ...string) ([]byte, error) {
		argv := append(append(sudo, "apt-get"), args...)
		cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
		cmd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
		cmd.WaitDelay = 5 * time.Second
		return cmd.CombinedOutput()
	}
	out, err := apt("install", "-y", "-qq", "tmux")
	if err != nil {
		// A fresh container has no package lists yet.
		if _, uerr := apt("update", "-qq"); uerr == nil {
			out, err = apt("install", "-y", "-qq", "tmux")
		}
	}
	if err != nil {
		return "", fmt.Sprintf("tmux is not on PATH, and apt-get install tmux failed: %v: %s", err, strings.TrimSpace(string(out)))
	}
	if p, err := exec.LookPath("tmux"); err == nil {
		return p, ""
	}
	return "", "apt-get installed tmux, but it is not on PATH"
}
