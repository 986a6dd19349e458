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
)

// heldChild runs a stockctl command (lock or semaphore) in the background
// with a child that signals it started and then waits for release to be
// removed; it returns a channel with the run's result and the function
// that lets the child finish.
func (e *env) heldChild(args ...string) (done <-chan result, finish func()) {
	e.t.Helper()
	dir := e.t.TempDir()
	started, hold := filepath.Join(dir, "started"), filepath.Join(dir, "hold")
	if err := os.WriteFile(hold, nil, 0o600); err != nil {
		e.t.Fatal(err)
	}
	ch := make(chan result, 1)
	go func() {
		var out, errOut syncBuffer
		script := "echo $STOCKCTL_FENCING_TOKEN > " + started + "; while [ -e " + hold + " ]; do sleep 0.05; done"
		code := runCtx(context.Background(), &out, &errOut, e.args(append(args, "--", "sh", "-c", script)...)...)
		ch <- result{code: code, stdout: out.String(), stderr: errOut.String()}
	}()
	etcdtest.WaitFor(e.t, "the child to start", 20*time.Second, func() bool {
		b, err := os.ReadFile(started)
		return err == nil && strings.TrimSpace(string(b)) != ""
	})
	return ch, func() { _ = os.Remove(hold) }
}

// `lock --shared` holders run together; an exclusive `lock` waits for them
// (its --timeout ends the wait, exit 1); `locks` lists holders and waiters.
func TestLockShared(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	done1, finish1 := e.heldChild("lock", "report", "--shared")
	// A second shared holder runs while the first holds.
	r := e.run("lock", "report", "--shared", "--", "sh", "-c", "echo $STOCKCTL_FENCING_TOKEN $STOCKCTL_LOCK_REVISION")
	if r.code != 0 {
		t.Fatalf("a second shared holder: exit %d, %q", r.code, r.stderr)
	}
	f := strings.Fields(r.stdout)
	token, _ := strconv.ParseInt(f[0], 10, 64)
	rev, _ := strconv.ParseInt(f[1], 10, 64)
	if token <= 0 || rev <= 0 || token>>16 != rev {
		t.Fatalf("the child saw token %q over revision %q", f[0], f[1])
	}
	checkFails(t, e.run("--timeout", "500ms", "lock", "report", "--", "true"), ExitFailure, "failed to acquire lock report", nil)

	var v locksView
	e.json(&v, "locks")
	if len(v.Locks) != 1 || v.Locks[0].Name != "report" || v.Locks[0].Type != "lock" || len(v.Locks[0].Holders) != 1 ||
		v.Locks[0].Holders[0].Kind != "shared" || len(v.Locks[0].Waiters) != 0 || v.Revision == 0 {
		t.Fatalf("locks = %+v", v)
	}
	out := e.ok("-o", "json", "locks")
	checkShape(t, "locks", out, "revision", "locks")
	checkShape(t, "locks[0]", strings.TrimSpace(out[strings.Index(out, "[")+1:strings.LastIndex(out, "]")]), "name", "type", "limit", "holders", "waiters")
	if table := e.ok("locks"); !strings.Contains(table, "report") || !strings.Contains(table, "holds") {
		t.Fatalf("locks table:\n%s", table)
	}
	finish1()
	if r := await(t, done1, 30*time.Second); r.code != 0 {
		t.Fatalf("the first holder: exit %d, %q", r.code, r.stderr)
	}
	if out := e.ok("locks"); !strings.Contains(out, "no lock or semaphore") {
		t.Fatalf("locks after everyone left:\n%s", out)
	}
}

// `semaphore` runs at most --limit children at once; another --limit is a
// conflict (exit 5), a bad one a usage error (exit 2); the child gets a
// fencing token.
func TestSemaphoreCommand(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	done1, finish1 := e.heldChild("semaphore", "db", "--limit", "2")
	done2, finish2 := e.heldChild("semaphore", "db", "--limit", "2")
	checkFails(t, e.run("--timeout", "500ms", "semaphore", "db", "--limit", "2", "--", "true"), ExitFailure, "failed to acquire a permit of semaphore db", nil)
	checkFails(t, e.run("semaphore", "db", "--limit", "3", "--", "true"), ExitConflict, "semaphore limit mismatch: asked with limit 3, held with limit 2", nil)
	for _, bad := range [][]string{
		{"semaphore", "db", "--", "true"},
		{"semaphore", "db", "--limit", "0", "--", "true"},
		{"semaphore", "db", "--limit", "1025", "--", "true"},
		{"semaphore", "a/b", "--limit", "1", "--", "true"},
		{"semaphore", "db", "--limit", "1"},
	} {
		checkFails(t, e.run(bad...), ExitUsage, "", bad)
	}
	var v locksView
	e.json(&v, "locks")
	if len(v.Locks) != 1 || v.Locks[0].Type != "semaphore" || v.Locks[0].Limit != 2 || len(v.Locks[0].Holders) != 2 {
		t.Fatalf("locks = %+v", v)
	}
	finish1()
	finish2()
	for _, d := range []<-chan result{done1, done2} {
		if r := await(t, d, 30*time.Second); r.code != 0 {
			t.Fatalf("a holder: exit %d, %q", r.code, r.stderr)
		}
	}
	r := e.run("semaphore", "db", "--limit", "3", "--", "sh", "-c", "echo $STOCKCTL_FENCING_TOKEN; exit 4")
	if tok, _ := strconv.ParseInt(strings.TrimSpace(r.stdout), 10, 64); r.code != 4 || tok <= 0 {
		t.Fatalf("a new limit once nobody holds: exit %d (want the child's 4), token %q", r.code, r.stdout)
	}
}
