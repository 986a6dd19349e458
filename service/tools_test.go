//go:build unix

package service_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Clients no one here wrote run as separate programs: curl (on PATH),
// grpcurl (built from its pinned module into a cache directory when it is
// not on PATH) and Debian's python3-grpcio (installed with apt-get when the
// tests run as root and it is missing). Installs are bounded in time and
// serialised across test binaries by a file lock; a test skips, saying
// why, only when its client cannot be had.

const (
	grpcurlModule  = "github.com/fullstorydev/grpcurl/cmd/grpcurl"
	grpcurlVersion = "v1.9.4"
	installTimeout = 5 * time.Minute
	// envNoInstall set to "0" forbids these tests to install anything.
	envNoInstall = "STOCKCTL_TEST_INSTALL"
)

// grpcurlPath returns a grpcurl binary, building the pinned release into
// the user's cache directory once.
func grpcurlPath(t *testing.T) string {
	t.Helper()
	if p, err := exec.LookPath("grpcurl"); err == nil {
		return p
	}
	path, why := grpcurlOnce()
	if path == "" {
		t.Skipf("no grpcurl: %s (install it with `go install %s@%s`)", why, grpcurlModule, grpcurlVersion)
	}
	return path
}

var grpcurlOnce = sync.OnceValues(func() (string, string) {
	cache, err := os.UserCacheDir()
	if err != nil {
		return "", fmt.Sprintf("no cache directory: %v", err)
	}
	dir := filepath.Join(cache, "stockctl", "test-tools", "grpcurl-"+grpcurlVersion)
	bin := filepath.Join(dir, "grpcurl")
	if _, err := os.Stat(bin); err == nil {
		return bin, ""
	}
	if os.Getenv(envNoInstall) == "0" {
		return "", envNoInstall + "=0 forbids building it"
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err.Error()
	}
	ctx, cancel := context.WithTimeout(context.Background(), installTimeout)
	defer cancel()
	unlock, err := lockFile(ctx, filepath.Join(dir, ".lock"))
	if err != nil {
		return "", err.Error()
	}
	defer unlock()
	if _, err := os.Stat(bin); err == nil { // built by another test binary meanwhile
		return bin, ""
	}
	cmd := exec.CommandContext(ctx, "go", "install", grpcurlModule+"@"+grpcurlVersion)
	cmd.Env = append(os.Environ(), "GOBIN="+dir, "GOFLAGS=-mod=mod")
	cmd.WaitDelay = 5 * time.Second
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Sprintf("go install %s@%s failed: %v: %s", grpcurlModule, grpcurlVersion, err, lastBytes(out, 400))
	}
	return bin, ""
})

// pythonWithGRPC returns Debian's python3 once it can import grpc and
// grpc_tools, installing python3-grpcio and python3-grpc-tools with
// apt-get when allowed. (The python3 first on PATH may be another one,
// without Debian's packages: /usr/bin/python3 is used on purpose.)
func pythonWithGRPC(t *testing.T) string {
	t.Helper()
	const python = "/usr/bin/python3"
	if _, err := os.Stat(python); err != nil {
		t.Skipf("no %s: the Python client test needs Debian's python3 with python3-grpcio", python)
	}
	if why := pythonOnce(); why != "" {
		t.Skipf("no Python gRPC: %s", why)
	}
	return python
}

var pythonOnce = sync.OnceValue(func() string {
	const python = "/usr/bin/python3"
	has := func() bool { return exec.Command(python, "-c", "import grpc, grpc_tools.protoc").Run() == nil }
	if has() {
		return ""
	}
	switch {
	case os.Getenv(envNoInstall) == "0":
		return "python3-grpcio or python3-grpc-tools is missing and " + envNoInstall + "=0 forbids installing them"
	case os.Geteuid() != 0:
		return "python3-grpcio or python3-grpc-tools is missing, and installing them needs root (apt-get install python3-grpcio python3-grpc-tools)"
	}
	if _, err := exec.LookPath("apt-get"); err != nil {
		return "python3-grpcio or python3-grpc-tools is missing, and there is no apt-get"
	}
	ctx, cancel := context.WithTimeout(context.Background(), installTimeout)
	defer cancel()
	// The same lock as internal/etcdtest's install of etcd-server: two
	// apt-gets at once fail on dpkg's lock instead of waiting.
	unlock, err := lockFile(ctx, filepath.Join(os.TempDir(), "stockctl-etcdtest-install.lock"))
	if err != nil {
		return err.Error()
	}
	defer unlock()
	if has() {
		return ""
	}
	pkgs := []string{"install", "-y", "-qq", "python3-grpcio", "python3-grpc-tools"}
	out, err := aptGet(ctx, pkgs...)
	if err != nil { // a fresh machine has no package lists yet
		if _, uerr := aptGet(ctx, "update", "-qq"); uerr == nil {
			out, err = aptGet(ctx, pkgs...)
		}
	}
	if err != nil {
		return fmt.Sprintf("apt-get install python3-grpcio python3-grpc-tools failed: %v: %s", err, lastBytes(out, 400))
	}
	if !has() {
		return "apt-get installed python3-grpcio and python3-grpc-tools, but python3 still cannot import them"
	}
	return ""
})

func aptGet(ctx context.Context, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, "apt-get", args...)
	cmd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
	cmd.WaitDelay = 5 * time.Second
	return cmd.CombinedOutput()
}

// lockFile takes an exclusive flock on path, waiting until ctx ends.
func lockFile(ctx context.Context, path string) (unlock func(), err error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, err
	}
	for {
		if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err == nil {
			return func() { _ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN); f.Close() }, nil
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, fmt.Errorf("waiting for the lock %s: %w", path, ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// run runs a client program, bounded by hangBound, and returns its
// combined output and exit error.
func run(t *testing.T, name string, args ...string) (string, error) {
	t.Helper()
	c, cancel := context.WithTimeout(t.Context(), hangBound)
	defer cancel()
	cmd := exec.CommandContext(c, name, args...)
	cmd.WaitDelay = 5 * time.Second
	out, err := cmd.CombinedOutput()
	return string(out), err
}

func lastBytes(b []byte, n int) string {
	s := strings.TrimSpace(string(b))
	if len(s) > n {
		s = "…" + s[len(s)-n:]
	}
	return s
}
