package cli

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stockctl/stockctl/internal/etcdtest"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// The child runs with the lock's key and fencing token in its environment,
// and stockctl exits with the child's status.
func TestLockPassesEnvAndExitStatus(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	r := e.run("lock", "job", "--", "sh", "-c", `echo "name=$STOCKCTL_LOCK_NAME key=$STOCKCTL_LOCK_KEY token=$STOCKCTL_FENCING_TOKEN"; echo oops >&2; exit 7`)
	if r.code != 7 {
		t.Fatalf("exit %d, want the child's 7; stderr %q", r.code, r.stderr)
	}
	if r.stderr != "oops\n" {
		t.Fatalf("stderr %q, want only the child's", r.stderr)
	}
	var name, key string
	var token int64
	for _, f := range strings.Fields(r.stdout) {
		k, v, _ := strings.Cut(f, "=")
		switch k {
		case "name":
			name = v
		case "key":
			key = v
		case "token":
			token, _ = strconv.ParseInt(v, 10, 64)
		}
	}
	if name != "job" || !strings.HasPrefix(key, e.prefix+"locks/job/") || token <= 0 {
		t.Fatalf("child saw name %q key %q token %d (stdout %q)", name, key, token, r.stdout)
	}
	// The lock was released: its key is gone, and the next holder gets a
	// larger fencing token.
	if resp, err := shared.client.Get(t.Context(), key); err != nil || len(resp.Kvs) != 0 {
		t.Fatalf("lock key after exit: %v %v", resp, err)
	}
	r = e.run("lock", "job", "--", "sh", "-c", `echo $STOCKCTL_FENCING_TOKEN`)
	next, _ := strconv.ParseInt(strings.TrimSpace(r.stdout), 10, 64)
	if r.code != 0 || next <= token {
		t.Fatalf("second holder: exit %d, token %d after %d", r.code, next, token)
	}
	// A child whose own child keeps its output open: stockctl waits --grace
	// for the output, then exits with the child's status anyway.
	start := time.Now()
	// The bound is far below the background sleep and far above any
	// machine's start-up time: only waiting for the sleep can break it.
	if r := e.run("lock", "job", "--grace", "200ms", "--", "sh", "-c", "sleep 60 & exit 3"); r.code != 3 {
		t.Fatalf("child leaving a background process: exit %d, want 3; stderr %q", r.code, r.stderr)
	}
	if took := time.Since(start); took > 30*time.Second {
		t.Fatalf("took %v: waited for the background process", took)
	}
	// A child killed by a signal: 128 + the signal, like a shell.
	if r := e.run("lock", "job", "--", "sh", "-c", "kill -KILL $$"); r.code != 128+9 {
		t.Fatalf("child killed by SIGKILL: exit %d, want 137", r.code)
	}
}

// lockedChild runs `stockctl lock` in the background with a child that
// records its pid and sleeps; it returns the pid and a channel with the
// run's result.
func (e *env) lockedChild(name string, extra []string, script string) (pid int, done <-chan result) {
	e.t.Helper()
	dir := e.t.TempDir()
	pidFile := filepath.Join(dir, "pid")
	ch := make(chan result, 1)
	go func() {
		var out, errOut syncBuffer
		// A script's leading trap is set before the pid file says the
		// child runs: a signal sent on that word finds it in place (on a
		// busy machine the SIGTERM came before the trap, and sh died of it).
		prelude := ""
		if strings.HasPrefix(script, "trap ") {
			prelude, script, _ = strings.Cut(script, "; ")
			prelude += "; "
		}
		args := append(append([]string{"lock", name}, extra...), "--", "sh", "-c", prelude+"echo $$ > "+pidFile+".tmp; mv "+pidFile+".tmp "+pidFile+"; "+script)
		code := runCtx(context.Background(), &out, &errOut, e.args(args...)...)
		ch <- result{code: code, stdout: out.String(), stderr: errOut.String()}
	}()
	etcdtest.WaitFor(e.t, "the child to start", 20*time.Second, func() bool {
		b, err := os.ReadFile(pidFile)
		if err != nil {
			return false
		}
		pid, err = strconv.Atoi(strings.TrimSpace(string(b)))
		return err == nil
	})
	return pid, ch
}

// revokeLock revokes the lease of the lock's key: what etcd does when the
// holder's process stops renewing it.
func (e *env) revokeLock(name string) {
	e.t.Helper()
	resp, err := shared.client.Get(e.t.Context(), e.prefix+"locks/"+name+"/", clientv3.WithPrefix())
	if err != nil || len(resp.Kvs) != 1 {
		e.t.Fatalf("lock keys of %s: %v, %v", name, resp, err)
	}
	if _, err := shared.client.Revoke(e.t.Context(), clientv3.LeaseID(resp.Kvs[0].Lease)); err != nil {
		e.t.Fatal(err)
	}
}

// alive reports whether a process runs (a zombie does not count).
func alive(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	// pid (comm) state ...
	s := string(b)
	i := strings.LastIndex(s, ")")
	return i < 0 || i+2 >= len(s) || s[i+2] != 'Z'
}

func await(t *testing.T, done <-chan result, within time.Duration) result {
	t.Helper()
	within = etcdtest.HangLimit(within)
	select {
	case r := <-done:
		return r
	case <-time.After(within):
		t.Fatalf("stockctl lock still running after %v", within)
		return result{}
	}
}

// Invariant: when the lock is lost (its lease revoked), the child and the
// processes it started are stopped and stockctl exits 1 saying so.
func TestLockLostStopsChild(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	// The sleep runs in the background so that it is a grandchild: the
	// whole process group must be stopped, not just the shell.
	dir := t.TempDir()
	pid, done := e.lockedChild("cron", []string{"--ttl", "2s"}, "sleep 60 & echo $! > "+dir+"/grandchild; wait")
	var grandchild int
	etcdtest.WaitFor(t, "the grandchild", 10*time.Second, func() bool {
		b, _ := os.ReadFile(dir + "/grandchild")
		grandchild, _ = strconv.Atoi(strings.TrimSpace(string(b)))
		return grandchild > 0
	})
	start := time.Now()
	e.revokeLock("cron")
	r := await(t, done, 15*time.Second)
	t.Logf("stopped %v after the revoke: %s", time.Since(start), r.stderr)
	checkFails(t, r, ExitFailure, "lock cron lost", nil)
	if !strings.Contains(r.stderr, "stopped it with SIGTERM") {
		t.Fatalf("stderr %q does not say how the child was stopped", r.stderr)
	}
	etcdtest.WaitFor(t, "the child and grandchild to be gone", 5*time.Second, func() bool { return !alive(pid) && !alive(grandchild) })
}

// A child that ignores SIGTERM gets SIGKILL after --grace.
func TestLockLostEscalatesToSIGKILL(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	pid, done := e.lockedChild("stubborn", []string{"--grace", "300ms"}, `trap "" TERM; while :; do sleep 1; done`)
	e.revokeLock("stubborn")
	r := await(t, done, 15*time.Second)
	checkFails(t, r, ExitFailure, "lock stubborn lost", nil)
	if !strings.Contains(r.stderr, "SIGKILL after --grace 300ms") {
		t.Fatalf("stderr %q does not say SIGKILL", r.stderr)
	}
	etcdtest.WaitFor(t, "the child to be gone", 5*time.Second, func() bool { return !alive(pid) })
}

// Invariant: two lock commands never run their children at once: the
// second waits for the first.
func TestLockExcludes(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	dir := t.TempDir()
	marker := filepath.Join(dir, "inside")
	// Each child fails if it finds the other's marker, and holds its own
	// for a while.
	script := `if [ -e ` + marker + ` ]; then exit 99; fi; touch ` + marker + `; sleep 0.3; rm ` + marker
	results := make(chan result, 3)
	for range 3 {
		go func() {
			var out, errOut syncBuffer
			code := runCtx(context.Background(), &out, &errOut, e.args("lock", "once", "--", "sh", "-c", script)...)
			results <- result{code: code, stderr: errOut.String()}
		}()
	}
	for range 3 {
		if r := await(t, results, 30*time.Second); r.code != 0 {
			t.Fatalf("a holder exited %d (99: two ran at once): %q", r.code, r.stderr)
		}
	}
}
