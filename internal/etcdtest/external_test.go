package etcdtest

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// An etcd server we did not build serves the calls stockctl makes: plain
// puts and gets, and writes fenced by a lock key's create revision.
func TestExternal(t *testing.T) {
	e := NewExternal(t, WithNoFsync())
	t.Logf("etcd %s from %s at %v", e.Version(), e.bin.path, e.Endpoints())
	if !strings.HasPrefix(e.Version(), "3.") {
		t.Fatalf("Version() = %q, want 3.x", e.Version())
	}
	c := e.Client(t)

	t.Run("put get", func(t *testing.T) {
		eventually(t, "put", putOp(c, "k", "v1"))
		if got := mustGet(t, c, "k"); got != "v1" {
			t.Fatalf("Get = %q, want v1", got)
		}
	})

	t.Run("fenced txn", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
		defer cancel()
		lease, err := c.Grant(ctx, 30)
		if err != nil {
			t.Fatalf("Grant: %v", err)
		}
		const lockKey, dataKey = "locks/invoice", "data/invoice"
		token := acquire(t, c, lockKey, lease.ID)

		// The holder writes while its lock key is the one it created.
		fenced := func(token int64, value string) bool {
			t.Helper()
			resp, err := c.Txn(ctx).
				If(clientv3.Compare(clientv3.CreateRevision(lockKey), "=", token)).
				Then(clientv3.OpPut(dataKey, value)).
				Commit()
			if err != nil {
				t.Fatalf("fenced put of %q with token %d: %v", value, token, err)
			}
			return resp.Succeeded
		}
		if !fenced(token, "paid") {
			t.Fatalf("fenced put with the holder's token %d failed", token)
		}

		// The lock is lost and taken by someone else: the old holder's
		// token no longer matches, and its write must not land.
		if _, err := c.Delete(ctx, lockKey); err != nil {
			t.Fatalf("Delete(%q): %v", lockKey, err)
		}
		if fenced(token, "stale") {
			t.Fatalf("fenced put with token %d succeeded while nobody held the lock", token)
		}
		newToken := acquire(t, c, lockKey, lease.ID)
		if newToken <= token {
			t.Fatalf("new token %d not above the old %d", newToken, token)
		}
		if fenced(token, "stale") {
			t.Fatalf("fenced put with the stale token %d succeeded after the lock changed hands", token)
		}
		if got := mustGet(t, c, dataKey); got != "paid" {
			t.Fatalf("%s = %q after the stale writes, want paid", dataKey, got)
		}
		if !fenced(newToken, "refunded") {
			t.Fatalf("fenced put with the new holder's token %d failed", newToken)
		}
	})
}

// acquire creates key under lease if it does not exist, the way a lock is
// taken, and returns its create revision: the fencing token.
func acquire(t *testing.T, c *clientv3.Client, key string, lease clientv3.LeaseID) int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	resp, err := c.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
		Then(clientv3.OpPut(key, "holder", clientv3.WithLease(lease))).
		Commit()
	if err != nil {
		t.Fatalf("acquire %s: %v", key, err)
	}
	if !resp.Succeeded {
		t.Fatalf("acquire %s: already held", key)
	}
	return resp.Header.Revision
}

// Stop ends the process, is idempotent, and leaves clients facing nothing.
func TestExternalStop(t *testing.T) {
	e := NewExternal(t, WithNoFsync())
	c := e.Client(t)
	eventually(t, "put", putOp(c, "k", "v"))

	start := time.Now()
	e.Stop()
	t.Logf("stop took %v", time.Since(start).Round(time.Millisecond))
	select {
	case <-e.exited:
	default:
		t.Fatal("process still running after Stop")
	}
	if !e.cmd.ProcessState.Exited() && e.cmd.ProcessState.String() != "signal: terminated" {
		t.Errorf("etcd ended with %s, want a clean exit on SIGTERM", e.cmd.ProcessState)
	}
	e.Stop() // no-op

	ctx, cancel := context.WithTimeout(t.Context(), 500*time.Millisecond)
	defer cancel()
	if _, err := c.Get(ctx, "k"); err == nil {
		t.Fatal("Get succeeded after Stop")
	}
}

// Without a binary to run or permission to install one, NewExternal skips
// the test instead of failing it.
func TestNewExternalSkipsWithoutBinary(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	t.Setenv(EnvEtcdBin, "")
	t.Setenv(EnvEtcdInstall, "0")
	skipped := false
	t.Run("no etcd", func(t *testing.T) {
		t.Cleanup(func() { skipped = t.Skipped() })
		NewExternal(t)
		t.Error("NewExternal returned without a binary")
	})
	if !skipped {
		t.Fatal("NewExternal did not skip")
	}
}

// fakeEtcd writes an executable that answers --version as etcd does, and
// refuses --unsafe-no-fsync unless noFsync.
func fakeEtcd(t *testing.T, dir, version string, noFsync bool) string {
	t.Helper()
	refuse := `--unsafe-no-fsync) echo "flag provided but not defined: -unsafe-no-fsync" >&2; exit 2;;`
	if noFsync {
		refuse = ""
	}
	script := "#!/bin/sh\nfor a; do case $a in " + refuse + " *) ;; esac; done\n" +
		"echo 'etcd Version: " + version + "'\necho 'Git SHA: fake'\n"
	path := filepath.Join(dir, "etcd")
	if err := os.WriteFile(path, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestLocateEtcd(t *testing.T) {
	if _, err := exec.LookPath("sh"); err != nil {
		t.Skip("no sh to run a fake etcd with")
	}
	withEtcd := t.TempDir()
	fake := fakeEtcd(t, withEtcd, "3.9.9", false)
	empty := t.TempDir()
	for _, tc := range []struct {
		name               string
		bin, path, install string
		want, skip, err    string // substrings; "" wants none
	}{
		{name: "bin set", bin: fake, path: empty, install: "0", want: fake},
		{name: "bin missing", bin: "/nonexistent/etcd", path: withEtcd, install: "0", err: `STOCKCTL_ETCD_BIN="/nonexistent/etcd"`},
		{name: "etcd on PATH", path: withEtcd, install: "0", want: fake},
		{name: "none, install forbidden", path: empty, install: "0", skip: "STOCKCTL_ETCD_INSTALL=0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv(EnvEtcdBin, tc.bin)
			t.Setenv("PATH", tc.path)
			t.Setenv(EnvEtcdInstall, tc.install)
			got, skip, err := locateEtcd()
			if (err == nil) != (tc.err == "") || (err != nil && !strings.Contains(err.Error(), tc.err)) {
				t.Fatalf("err = %v, want one saying %q", err, tc.err)
			}
			if (skip == "") != (tc.skip == "") || !strings.Contains(skip, tc.skip) {
				t.Fatalf("skip = %q, want one saying %q", skip, tc.skip)
			}
			if got != tc.want {
				t.Fatalf("path = %q, want %q", got, tc.want)
			}
		})
	}
}

func TestProbeEtcd(t *testing.T) {
	if _, err := exec.LookPath("sh"); err != nil {
		t.Skip("no sh to run a fake etcd with")
	}
	for _, tc := range []struct {
		name    string
		noFsync bool
	}{
		{"has --unsafe-no-fsync", true},
		{"lacks --unsafe-no-fsync", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, err := probeEtcd(fakeEtcd(t, t.TempDir(), "3.4.1", tc.noFsync))
			if err != nil {
				t.Fatal(err)
			}
			if b.version != "3.4.1" || b.noFsync != tc.noFsync {
				t.Fatalf("probe = %+v, want version 3.4.1, noFsync %v", b, tc.noFsync)
			}
		})
	}
}

func TestParseVersion(t *testing.T) {
	for _, tc := range []struct{ name, out, want string }{
		{"debian 3.4", "etcd Version: 3.4.23\nGit SHA: Not provided (use ./build instead of go build)\nGo Version: go1.19.8\n", "3.4.23"},
		{"upstream 3.5", "etcd Version: 3.5.17\nGit SHA: 507c0de\nGo Version: go1.22.9\nGo OS/Arch: linux/amd64\n", "3.5.17"},
		{"warning first", "running etcd on unsupported architecture\netcd Version: 3.6.0-rc.1\n", "3.6.0-rc.1"},
		{"not etcd", "usage: something else\n", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseVersion(tc.out)
			if tc.want == "" {
				if err == nil {
					t.Fatalf("parseVersion = %q, want an error", got)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("parseVersion = %q, %v; want %q", got, err, tc.want)
			}
		})
	}
}

// Invariant: while one holder has the install lock, nobody else gets it
// until the holder lets go, and a waiter gives up when its ctx ends.
func TestLockFileExcludes(t *testing.T) {
	name := "stockctl-etcdtest-locktest-" + strings.ReplaceAll(t.Name(), "/", "_")
	t.Cleanup(func() { os.Remove(filepath.Join(os.TempDir(), name)) })
	unlock, err := lockFile(t.Context(), name)
	if err != nil {
		t.Skipf("no file locks here: %v", err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	if u, err := lockFile(ctx, name); err == nil {
		u()
		t.Fatal("second lockFile succeeded while the first held the lock")
	} else if !strings.Contains(err.Error(), "held by another process") {
		t.Fatalf("second lockFile: %v, want it to say the lock is held", err)
	}
	unlock()
	ctx, cancel = context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	u, err := lockFile(ctx, name)
	if err != nil {
		t.Fatalf("lockFile after unlock: %v", err)
	}
	u()
}
