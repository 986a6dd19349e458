package etcdtest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"
)

// Environment variables that choose the etcd binary NewExternal runs.
const (
	// EnvEtcdBin names the etcd server binary to run. Unset, NewExternal
	// runs "etcd" from PATH.
	EnvEtcdBin = "STOCKCTL_ETCD_BIN"
	// EnvEtcdInstall set to "0" forbids NewExternal to install Debian's
	// etcd-server package when no binary is found; tests then skip.
	EnvEtcdInstall = "STOCKCTL_ETCD_INSTALL"
)

// versionProbeTimeout bounds "etcd --version": the binary answers at once,
// unless it is not etcd at all and waits for something.
const versionProbeTimeout = 10 * time.Second

// etcdBinary is what NewExternal needs to know about a binary before it
// starts it.
type etcdBinary struct {
	path    string
	version string // e.g. "3.4.23"
	noFsync bool   // accepts --unsafe-no-fsync
}

// binaries caches probed binaries by path: every NewExternal of a test
// binary would otherwise run the same two probes again.
var binaries struct {
	sync.Mutex
	m map[string]etcdBinary
}

// findEtcd returns the etcd binary to run, installing Debian's etcd-server
// when allowed, or skips t when there is none. A STOCKCTL_ETCD_BIN that
// names nothing runnable fails t: whoever set it wants these tests to run.
func findEtcd(t testing.TB) etcdBinary {
	t.Helper()
	path, skip, err := locateEtcd()
	if err != nil {
		t.Fatalf("etcdtest: %v", err)
	}
	if skip != "" {
		t.Skipf("etcdtest: no etcd server binary to run (%s). Install one (Debian/Ubuntu: apt-get install etcd-server) "+
			"or set %s to its path", skip, EnvEtcdBin)
	}
	binaries.Lock()
	defer binaries.Unlock()
	if b, ok := binaries.m[path]; ok {
		return b
	}
	b, err := probeEtcd(path)
	if err != nil {
		t.Fatalf("etcdtest: %v", err)
	}
	if binaries.m == nil {
		binaries.m = map[string]etcdBinary{}
	}
	binaries.m[path] = b
	return b
}

// locateEtcd finds the binary: STOCKCTL_ETCD_BIN, else etcd on PATH, else
// the one the etcd-server package installs. skip says why there is none.
func locateEtcd() (path, skip string, err error) {
	if p := os.Getenv(EnvEtcdBin); p != "" {
		found, err := exec.LookPath(p)
		if err != nil {
			return "", "", fmt.Errorf("%s=%q is not an executable etcd binary: %w", EnvEtcdBin, p, err)
		}
		return found, "", nil
	}
	if p, err := exec.LookPath("etcd"); err == nil {
		return p, "", nil
	}
	switch {
	case os.Getenv(EnvEtcdInstall) == "0":
		return "", fmt.Sprintf("etcd is not on PATH, and %s=0 forbids installing it", EnvEtcdInstall), nil
	case os.Geteuid() != 0:
		return "", "etcd is not on PATH, and installing Debian's etcd-server needs root", nil
	}
	if _, err := exec.LookPath("apt-get"); err != nil {
		return "", "etcd is not on PATH, and there is no apt-get to install Debian's etcd-server with", nil
	}
	p, why := installOnce()
	return p, why, nil
}

// installOnce installs Debian's etcd-server at most once per test binary:
// after a failure, the other tests skip at once instead of trying again.
var installOnce = sync.OnceValues(installEtcdServer)

// Installing is bounded: apt-get waiting on a dpkg lock held by a stuck
// process must not hang the test run until go test's own timeout.
const (
	installTimeout = 4 * time.Minute
	installLock    = "stockctl-etcdtest-install.lock"
)

// installEtcdServer runs apt-get install etcd-server and returns the
// binary's path, or "" and why not. It holds a file lock meanwhile, because
// go test runs the test binaries of several packages at once and two
// apt-gets fail on dpkg's lock instead of waiting for each other.
func installEtcdServer() (path, why string) {
	ctx, cancel := context.WithTimeout(context.Background(), installTimeout)
	defer cancel()
	unlock, err := lockFile(ctx, installLock)
	if err != nil {
		return "", fmt.Sprintf("etcd is not on PATH, and installing etcd-server failed: %v", err)
	}
	defer unlock()
	// Another test binary may have installed it while we waited.
	if p, ok := installedEtcd(); ok {
		return p, ""
	}
	out, err := aptGet(ctx, "install", "-y", "-qq", "etcd-server")
	if err != nil {
		// A fresh container has no package lists yet.
		if _, uerr := aptGet(ctx, "update", "-qq"); uerr == nil {
			out, err = aptGet(ctx, "install", "-y", "-qq", "etcd-server")
		}
	}
	if err != nil {
		return "", fmt.Sprintf("etcd is not on PATH, and apt-get install etcd-server failed: %v: %s", err, tail(out, 400))
	}
	if p, ok := installedEtcd(); ok {
		return p, ""
	}
	return "", "apt-get installed etcd-server, but no etcd binary is on PATH or at /usr/bin/etcd"
}

// aptGet runs apt-get non-interactively. The package's post-install script
// may try to start etcd as a service; in a container without systemd that
// fails harmlessly, and where it succeeds the service listens on the
// default ports, which NewExternal never uses.
func aptGet(ctx context.Context, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, "apt-get", args...)
	cmd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
	cmd.WaitDelay = 5 * time.Second
	out, err := cmd.CombinedOutput()
	if ctx.Err() != nil {
		err = fmt.Errorf("%w (gave up after %v)", err, installTimeout)
	}
	return out, err
}

func installedEtcd() (string, bool) {
	if p, err := exec.LookPath("etcd"); err == nil {
		return p, true
	}
	if _, err := exec.LookPath("/usr/bin/etcd"); err == nil {
		return "/usr/bin/etcd", true
	}
	return "", false
}

var versionLine = regexp.MustCompile(`(?m)^etcd Version:\s*(\S+)`)

// parseVersion reads the version from the output of "etcd --version".
func parseVersion(out string) (string, error) {
	m := versionLine.FindStringSubmatch(out)
	if m == nil {
		return "", fmt.Errorf("no \"etcd Version: X.Y.Z\" line in %q", tail([]byte(out), 200))
	}
	return m[1], nil
}

// probeEtcd asks the binary its version and whether it has
// --unsafe-no-fsync. etcd parses all flags before it looks at --version, so
// an unknown flag makes "etcd FLAG --version" fail; this finds the flag in
// releases that have it without listing it in --help (3.4.23 is one).
func probeEtcd(path string) (etcdBinary, error) {
	out, err := runProbe(path, "--version")
	if err != nil {
		return etcdBinary{}, fmt.Errorf("%s --version: %w: %s", path, err, tail(out, 400))
	}
	v, err := parseVersion(string(out))
	if err != nil {
		return etcdBinary{}, fmt.Errorf("%s --version: %w", path, err)
	}
	_, err = runProbe(path, "--unsafe-no-fsync", "--version")
	var exit *exec.ExitError
	if err != nil && !errors.As(err, &exit) {
		return etcdBinary{}, fmt.Errorf("%s --unsafe-no-fsync --version: %w", path, err)
	}
	return etcdBinary{path: path, version: v, noFsync: err == nil}, nil
}

func runProbe(path string, args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), versionProbeTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, path, args...)
	cmd.Env = etcdEnv()
	cmd.WaitDelay = time.Second
	return cmd.CombinedOutput()
}

// etcdEnv is the environment etcd runs with: ours without ETCD_* variables,
// which etcd reads as flags (ETCD_DATA_DIR, ETCD_NAME, ...), so that a
// developer's settings cannot change the server a test gets. Only
// ETCD_UNSUPPORTED_ARCH is kept: etcd refuses to start without it on some
// architectures.
func etcdEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "ETCD_") && !strings.HasPrefix(kv, "ETCD_UNSUPPORTED_ARCH=") {
			continue
		}
		env = append(env, kv)
	}
	return env
}

// tail returns at most the last n bytes of b, for messages.
func tail(b []byte, n int) string {
	s := strings.TrimSpace(string(b))
	if len(s) > n {
		s = "…" + s[len(s)-n:]
	}
	return s
}
