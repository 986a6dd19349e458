package etcdtest

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

const (
	// externalReadyWait bounds the wait for a started etcd to answer a Get.
	// etcd 3.4 on a small machine answers in well under a second.
	externalReadyWait = 20 * time.Second
	// externalStopWait is how long etcd gets to exit after SIGTERM before it
	// is killed; a clean shutdown takes a few hundred milliseconds.
	externalStopWait = 10 * time.Second
	// externalStartAttempts bounds restarts on fresh ports after another
	// process took one of the ports FreePorts returned.
	externalStartAttempts = 5
	// logTail is how much of etcd's log a failed start shows.
	logTail = 3000
)

// External is an etcd server process run from a binary we did not build
// (by default Debian's etcd-server, etcd 3.4), owned by a test.
type External struct {
	bin       etcdBinary
	endpoints []string
	logPath   string

	cmd      *exec.Cmd
	exited   chan struct{} // closed once the process has been waited for
	stopOnce sync.Once
}

// NewExternal starts a single-member etcd server from the binary named by
// STOCKCTL_ETCD_BIN, else "etcd" on PATH. Without either, and unless
// STOCKCTL_ETCD_INSTALL=0, it installs Debian's etcd-server package when it
// runs as root where apt-get exists; when there is still no binary it skips
// t. The server listens on free loopback ports, keeps its data in
// t.TempDir() and its log in a file there, and is stopped at t's cleanup.
// WithNoFsync is honoured when the binary has --unsafe-no-fsync;
// WithGRPCServerOptions cannot be, and fails t.
//
// It waits up to 20s for the server to answer a Get, and fails t, showing
// the end of the server's log, when it does not.
func NewExternal(t testing.TB, opts ...Option) *External {
	t.Helper()
	o := buildOptions(opts)
	if len(o.grpcOptions) > 0 {
		t.Fatalf("etcdtest: NewExternal: WithGRPCServerOptions needs an embedded member; an etcd binary's gRPC server cannot take them")
	}
	bin := findEtcd(t)
	if o.noFsync && !bin.noFsync {
		t.Logf("etcdtest: %s (etcd %s) has no --unsafe-no-fsync; running it with fsync", bin.path, bin.version)
	}
	// TempDir first: cleanups run last-in first-out, so the server is
	// stopped before the testing package removes its data dir.
	dir := t.TempDir()
	for attempt := 1; ; attempt++ {
		e := &External{bin: bin, logPath: filepath.Join(dir, fmt.Sprintf("etcd-%d.log", attempt))}
		t.Cleanup(e.Stop)
		err := e.start(t, filepath.Join(dir, fmt.Sprintf("data-%d", attempt)), o.noFsync && bin.noFsync)
		if err == nil {
			return e
		}
		e.Stop()
		log := e.logTail()
		// Another process took a port between FreePorts and etcd's bind.
		if strings.Contains(log, "address already in use") && attempt < externalStartAttempts {
			t.Logf("etcdtest: etcd %s: port taken, retrying on new ports (attempt %d)", bin.version, attempt)
			continue
		}
		t.Logf("etcdtest: end of the log of %s (%s):\n%s", bin.path, e.logPath, log)
		t.Fatalf("etcdtest: start etcd %s from %s: %v", bin.version, bin.path, err)
	}
}

// start runs etcd on fresh ports with its data in dataDir and waits until it
// answers. On failure the process may still run: the caller stops it.
func (e *External) start(t testing.TB, dataDir string, noFsync bool) error {
	ports := FreePorts(t, 2)
	client := fmt.Sprintf("http://127.0.0.1:%d", ports[0])
	peer := fmt.Sprintf("http://127.0.0.1:%d", ports[1])
	e.endpoints = []string{client}
	args := []string{
		"--name", "external",
		"--data-dir", dataDir,
		"--listen-client-urls", client,
		"--advertise-client-urls", client,
		"--listen-peer-urls", peer,
		"--initial-advertise-peer-urls", peer,
		"--initial-cluster", "external=" + peer,
		"--initial-cluster-state", "new",
		// zap, named because 3.4 defaults to capnslog, which later
		// releases dropped; these three flags mean the same in 3.4 to 3.7.
		// Warnings and errors still reach the log file for logTail.
		"--logger", "zap",
		"--log-level", "warn",
		"--log-outputs", "stderr",
	}
	if noFsync {
		args = append(args, "--unsafe-no-fsync")
	}
	logFile, err := os.Create(e.logPath)
	if err != nil {
		return fmt.Errorf("create log file: %w", err)
	}
	defer logFile.Close() // the child has its own copy of the descriptor
	cmd := exec.Command(e.bin.path, args...)
	cmd.Env = etcdEnv()
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = sysProcAttr()
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("run %s: %w", e.bin.path, err)
	}
	e.cmd = cmd
	e.exited = make(chan struct{})
	go func() {
		_ = cmd.Wait() // the exit status of a server we stop is of no interest
		close(e.exited)
	}()
	return e.waitReady(t)
}

// waitReady polls with a Get until etcd answers, it exits, or
// externalReadyWait has passed.
func (e *External) waitReady(t testing.TB) error {
	c, err := clientv3.New(clientv3.Config{Endpoints: e.endpoints, DialTimeout: dialTimeout, Logger: quietLogger(t)})
	if err != nil {
		return fmt.Errorf("client for %v: %w", e.endpoints, err)
	}
	defer c.Close()
	// A Get waiting on a server that has died would wait out its timeout;
	// ending it when the process exits reports a failed start at once.
	alive, dead := context.WithCancel(context.Background())
	defer dead()
	go func() {
		select {
		case <-e.exited:
			dead()
		case <-alive.Done():
		}
	}()
	deadline := time.Now().Add(externalReadyWait)
	for {
		ctx, cancel := context.WithTimeout(alive, time.Second)
		_, err = c.Get(ctx, "etcdtest-ready")
		cancel()
		if err == nil {
			return nil
		}
		select {
		case <-e.exited:
			return fmt.Errorf("etcd exited before it served: %s", e.cmd.ProcessState)
		default:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("no answer on %v within %v: %w", e.endpoints, externalReadyWait, err)
		}
		time.Sleep(pollInterval)
	}
}

// Version returns the server's version as "etcd --version" reports it, such
// as "3.4.23".
func (e *External) Version() string { return e.bin.version }

// Endpoints returns the server's client URL; it stays valid after Stop,
// pointing at nothing.
func (e *External) Endpoints() []string { return slices.Clone(e.endpoints) }

// Client returns a new client for the server, closed at t's cleanup.
func (e *External) Client(t testing.TB) *clientv3.Client {
	t.Helper()
	return newClient(t, e.endpoints)
}

// Stop sends etcd SIGTERM, kills it if it has not exited 10s later, and
// returns once it has exited. The data dir stays until the test ends.
// Stopping a stopped server is a no-op.
func (e *External) Stop() {
	e.stopOnce.Do(func() {
		if e.cmd == nil {
			return
		}
		if err := e.cmd.Process.Signal(syscall.SIGTERM); err != nil {
			_ = e.cmd.Process.Kill() // no SIGTERM on this OS, or it already exited
		}
		select {
		case <-e.exited:
			return
		case <-time.After(externalStopWait):
		}
		_ = e.cmd.Process.Kill()
		// SIGKILL cannot be ignored, but a process stuck in the kernel
		// (a hung disk) exits only when that returns: do not hang on it.
		select {
		case <-e.exited:
		case <-time.After(externalStopWait):
		}
	})
}

// logTail returns the end of etcd's log, for the message of a failed start.
func (e *External) logTail() string {
	b, err := os.ReadFile(e.logPath)
	if err != nil {
		return fmt.Sprintf("(no log: %v)", err)
	}
	return tail(b, logTail)
}
