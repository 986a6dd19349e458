//go:build linux

package cli

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stockctl/stockctl/internal/etcdtest"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// lockProcess is a `stockctl lock` run as a real process of the built
// binary, whose CMD records its pid and starts a grandchild in the
// background (as a shell script's commands are).
type lockProcess struct {
	cmd                *exec.Cmd
	stderr             *syncBuffer
	child, grandchild  int
	exited             chan error
	lockName, lockKeys string
}

// startLockProcess starts `stockctl lock NAME` or, with a limit, `stockctl
// semaphore NAME --limit N`, with flags (--ttl 2s if none). prelude runs
// before CMD starts its grandchild (a trap there is the grandchild's too).
func (e *env) startLockProcess(bin, name string, limit int, extraEnv, flags []string, prelude, script string) *lockProcess {
	e.t.Helper()
	dir := e.t.TempDir()
	if flags == nil {
		flags = []string{"--ttl", "2s"}
	}
	full := prelude + `echo $$ > ` + dir + `/child.tmp; mv ` + dir + `/child.tmp ` + dir + `/child; ` +
		`sleep 300 & echo $! > ` + dir + `/gc.tmp; mv ` + dir + `/gc.tmp ` + dir + `/grandchild; ` + script
	p := &lockProcess{stderr: &syncBuffer{}, exited: make(chan error, 1), lockName: name, lockKeys: e.prefix + "locks/" + name + "/"}
	hold := append([]string{"lock", name}, flags...)
	if limit > 0 {
		hold, p.lockKeys = append([]string{"semaphore", name, "--limit", strconv.Itoa(limit)}, flags...), e.prefix+"sems/"+name+"/"
	}
	p.cmd = exec.Command(bin, e.args(append(hold, "--", "sh", "-c", full)...)...)
	p.cmd.Env = append(os.Environ(), extraEnv...)
	p.cmd.Stdout = p.stderr
	p.cmd.Stderr = p.stderr
	if err := p.cmd.Start(); err != nil {
		e.t.Fatal(err)
	}
	go func() { p.exited <- p.cmd.Wait() }()
	readPid := func(f string) int {
		b, err := os.ReadFile(filepath.Join(dir, f))
		if err != nil {
			return 0
		}
		n, _ := strconv.Atoi(strings.TrimSpace(string(b)))
		return n
	}
	etcdtest.WaitFor(e.t, "the child and the grandchild to start", 60*time.Second, func() bool {
		p.child, p.grandchild = readPid("child"), readPid("grandchild")
		return p.child > 0 && p.grandchild > 0
	})
	e.t.Cleanup(func() {
		// Whatever the test found, leave nothing running.
		for _, pid := range []int{p.child, p.grandchild} {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		_ = p.cmd.Process.Kill()
	})
	return p
}

// Invariant (issue 19, item 3): CMD and what it started die with
// `stockctl lock`, whatever ends it. SIGTERM, SIGINT, SIGHUP and SIGQUIT are
// handled alike: CMD's process group gets SIGTERM, the lock is released at
// once, and stockctl exits with CMD's status. SIGKILL cannot be handled: the
// kernel kills CMD (Linux's parent-death signal) and the watcher stops its
// group; the lock lapses with its lease, and the next holder never runs
// beside them.
func TestLockChildDiesWithStockctl(t *testing.T) {
	t.Parallel()
	bin := buildStockctl(t)
	type kill struct {
		sig   syscall.Signal
		limit int // > 0: `stockctl semaphore --limit`, which shares lock's handling
	}
	var kills []kill
	for _, sig := range []syscall.Signal{syscall.SIGKILL, syscall.SIGHUP, syscall.SIGQUIT, syscall.SIGTERM, syscall.SIGINT} {
		kills = append(kills, kill{sig: sig})
	}
	kills = append(kills, kill{syscall.SIGHUP, 2}, kill{syscall.SIGQUIT, 2})
	for _, k := range kills {
		sig := k.sig
		name := sig.String()
		if k.limit > 0 {
			name = "semaphore " + name
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			p := e.startLockProcess(bin, "job", k.limit, nil, nil, "", "wait")
			if err := p.cmd.Process.Signal(sig); err != nil {
				t.Fatal(err)
			}
			var err error
			select {
			case err = <-p.exited:
			case <-time.After(60 * time.Second):
				t.Fatalf("stockctl lock still runs 60s after %v; output %q", sig, p.stderr.String())
			}
			etcdtest.WaitFor(t, "CMD and its grandchild to be gone", 30*time.Second, func() bool {
				return !alive(p.child) && !alive(p.grandchild)
			})
			var ee *exec.ExitError
			if !errors.As(err, &ee) {
				t.Fatalf("stockctl lock after %v: %v; output %q", sig, err, p.stderr.String())
			}
			if sig == syscall.SIGKILL {
				// The lease lapses after its TTL; then the next holder takes
				// the lock, and nothing of the first runs any more.
				r := e.run("--timeout", "60s", "lock", "job", "--", "true")
				if r.code != 0 {
					t.Fatalf("the next holder: exit %d, stderr %q", r.code, r.stderr)
				}
				if alive(p.child) || alive(p.grandchild) {
					t.Fatal("the first holder's processes run beside the next holder")
				}
				return
			}
			// Handled: CMD was stopped with SIGTERM (a shell dies of it: 143),
			// and the lock released at once, not left to its lease.
			if code := ee.ExitCode(); code != 128+int(syscall.SIGTERM) {
				t.Fatalf("exit %d after %v, want CMD's 143; output %q", code, sig, p.stderr.String())
			}
			if !strings.Contains(p.stderr.String(), "interrupted by "+sig.String()) {
				t.Fatalf("output %q does not say which signal ended it", p.stderr.String())
			}
			resp, err := shared.client.Get(t.Context(), p.lockKeys, clientv3.WithPrefix(), clientv3.WithCountOnly())
			if err != nil || resp.Count != 0 {
				t.Fatalf("lock keys after a handled %v: %v, %v; want none", sig, resp, err)
			}
		})
	}
}

// Invariant (issue 19, item 3): CMD's environment has the lock's variables
// and stockctl's others, but never STOCKCTL_USER, which carries the etcd
// password.
func TestLockChildEnvironmentHasNoPassword(t *testing.T) {
	t.Setenv("STOCKCTL_LOG_LEVEL", "warn") // an ordinary variable: passed on
	e := newEnv(t)
	t.Setenv(envUser, "root:not-needed-here") // auth is off on the shared etcd: ignored
	r := e.run("lock", "envjob", "--", "sh", "-c", `echo "user=${STOCKCTL_USER-unset} level=$STOCKCTL_LOG_LEVEL token=$STOCKCTL_FENCING_TOKEN"`)
	if r.code != 0 {
		t.Fatalf("exit %d, stderr %q", r.code, r.stderr)
	}
	if !strings.Contains(r.stdout, "user=unset ") || !strings.Contains(r.stdout, "level=warn ") || strings.Contains(r.stdout, "token= ") {
		t.Fatalf("CMD saw %q; want no STOCKCTL_USER, the other variables, a token", r.stdout)
	}
}

// Invariant (issue 28, item 2): when stockctl is SIGKILLed, what CMD
// started is gone before the lease lapses, whatever --ttl and --grace: the
// next holder, who waits for the lease, never runs beside it. CMD and its
// grandchild ignore SIGTERM, so only the watcher's SIGKILL after --grace
// stops the grandchild; the next holder's CMD looks at the grandchild the
// moment it starts. Before the fix, --ttl 2s with the default --grace 5s
// had the grandchild run ~3 s beside the next holder. The starved case
// kills a holder whose lease has under a second left: before the watcher
// timed its SIGKILL from the last renewal (not from the death), the
// grandchild ran beside the next holder in 3 runs of 3.
func TestLockKillNeverOverlapsNextHolder(t *testing.T) {
	t.Parallel()
	bin := buildStockctl(t)
	for _, tc := range []struct {
		name   string
		limit  int      // > 0: semaphore
		flags  []string // the first holder's
		starve bool     // stop stockctl until its lease has under a second left, then kill it
	}{
		{"lock ttl 2s default grace", 0, []string{"--ttl", "2s"}, false},
		{"lock ttl 2s grace at the bound", 0, []string{"--ttl", "2s", "--grace", "416ms"}, false},
		{"lock ttl 3s short grace", 0, []string{"--ttl", "3s", "--grace", "100ms"}, false},
		{"shared ttl 2s default grace", 0, []string{"--shared", "--ttl", "2s"}, false},
		{"semaphore ttl 2s default grace", 1, []string{"--ttl", "2s"}, false},
		{"semaphore ttl 4s grace at the bound", 1, []string{"--ttl", "4s", "--grace", "1083ms"}, false},
		{"lock ttl 6s grace at the bound starved", 0, []string{"--ttl", "6s", "--grace", "1750ms"}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			p := e.startLockProcess(bin, "job", tc.limit, nil, tc.flags, `trap "" TERM; `, "wait")
			if tc.starve {
				// A starved stockctl renews nothing: stopped, it dies only
				// when etcd gives its lease less than a second, less than
				// --grace. A kill timed from the death would come after the
				// lease lapsed; one timed from the last renewal comes at once.
				keys, err := shared.client.Get(t.Context(), p.lockKeys, clientv3.WithPrefix())
				if err != nil || len(keys.Kvs) == 0 {
					t.Fatalf("the first hold's key: %v, %v", keys, err)
				}
				lease := clientv3.LeaseID(keys.Kvs[0].Lease)
				if err := p.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
					t.Fatal(err)
				}
				etcdtest.WaitFor(t, "the stopped holder's lease to have under a second left", 60*time.Second, func() bool {
					r, err := shared.client.TimeToLive(t.Context(), lease)
					return err == nil && r.TTL <= 0 // 0: under a second; -1: expired
				})
			}
			if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			// The first hold outlives stockctl (its lease runs on), so the
			// next holder below has to wait for it: else the check would
			// prove nothing.
			if resp, err := shared.client.Get(t.Context(), p.lockKeys, clientv3.WithPrefix(), clientv3.WithCountOnly()); err != nil || resp.Count == 0 {
				if tc.starve && err == nil {
					// The test itself was starved past the lease: a holder
					// alive when its lease lapses is a lost lock, not this case.
					t.Skipf("the stopped holder's lease lapsed before the kill: nothing to check")
				}
				t.Fatalf("the first hold's key right after the kill: %v, %v; want it still there", resp, err)
			}
			next := []string{"--timeout", "60s", "lock", "job"}
			if tc.limit > 0 {
				next = []string{"--timeout", "60s", "semaphore", "job", "--limit", strconv.Itoa(tc.limit)}
			}
			look := fmt.Sprintf("cat /proc/%d/stat /proc/%d/stat 2>/dev/null; true", p.child, p.grandchild)
			r := e.run(append(next, "--", "sh", "-c", look)...)
			if r.code != 0 {
				t.Fatalf("the next holder: exit %d, stderr %q", r.code, r.stderr)
			}
			for line := range strings.Lines(r.stdout) {
				// pid (comm) state …: a zombie is dead.
				if i := strings.LastIndex(line, ")"); i > 0 && i+2 < len(line) && line[i+2] != 'Z' {
					t.Fatalf("the next holder started while the first one's process ran: %q", line)
				}
			}
		})
	}
}
