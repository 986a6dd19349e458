package cli

import (
	"context"
	"fmt"
	"maps"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stockctl/stockctl/internal/etcdtest"
	"github.com/stockctl/stockctl/internal/keys"
)

// Invariant: invalid input exits 2 with a message naming what was wrong,
// and changes nothing.
func TestBadInputsExit2AndChangeNothing(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.ok("init", "shoe", "--total", "50", "--segments", "5")
	e.ok("allocate", "shoe", "--order", "o1", "--qty", "1")
	before := fingerprint(t, e.prefix)
	var stBefore statusView
	e.json(&stBefore, "status", "shoe")

	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"init without total", []string{"init", "new", "--segments", "2"}, "missing --total"},
		{"init zero segments", []string{"init", "new", "--total", "5", "--segments", "0"}, "invalid --segments 0"},
		{"init fill above total", []string{"init", "new", "--total", "5", "--segments", "1", "--initial-fill", "6"}, "invalid --initial-fill 6"},
		{"init negative total", []string{"init", "new", "--total", "-5", "--segments", "1"}, "invalid --total -5"},
		{"init bad sku", []string{"init", "bad/sku", "--total", "5", "--segments", "1"}, `invalid sku "bad/sku"`},
		{"init no sku", []string{"init", "--total", "5", "--segments", "1"}, "missing SKU argument"},
		{"allocate zero qty", []string{"allocate", "shoe", "--order", "o2", "--qty", "0"}, "--qty: invalid qty 0"},
		{"allocate negative qty", []string{"allocate", "shoe", "--order", "o2", "--qty", "-3"}, "invalid qty -3"},
		{"allocate qty not a number", []string{"allocate", "shoe", "--order", "o2", "--qty", "two"}, `invalid value "two" for flag -qty`},
		{"allocate without order", []string{"allocate", "shoe", "--qty", "1"}, "missing --order"},
		{"allocate order with space", []string{"allocate", "shoe", "--order", "o 2", "--qty", "1"}, `invalid order "o 2"`},
		{"allocate two skus", []string{"allocate", "shoe", "boot", "--order", "o2", "--qty", "1"}, "too many arguments"},
		{"release without order", []string{"release", "shoe"}, "missing --order"},
		{"restock zero", []string{"restock", "shoe", "--delivery", "d1", "--qty", "0"}, "invalid qty 0"},
		{"restock without delivery", []string{"restock", "shoe", "--qty", "5"}, "missing --delivery"},
		{"restock bad delivery", []string{"restock", "shoe", "--delivery", "d/1", "--qty", "5"}, `--delivery: invalid delivery "d/1"`},
		{"status without sku", []string{"status"}, "missing SKU argument"},
		{"audit bad sku", []string{"audit", ".."}, `invalid sku ".."`},
		{"unknown flag", []string{"allocate", "shoe", "--order", "o2", "--qty", "1", "--colour", "red"}, "flag provided but not defined: -colour"},
		{"unknown command", []string{"sell", "shoe"}, `unknown command "sell"`},
		{"bad output", []string{"-o", "yaml", "status", "shoe"}, `invalid --output "yaml"`},
		{"bad prefix", []string{"--prefix", "a\x01b", "status", "shoe"}, "invalid --prefix"},
		{"bad endpoint", []string{"--endpoints", "127.0.0.1", "status", "shoe"}, `invalid --endpoints entry "127.0.0.1": missing port`},
		{"negative timeout", []string{"--timeout", "-1s", "status", "shoe"}, "invalid --timeout -1s"},
		{"user without password", []string{"--user", "bob", "status", "shoe"}, "invalid --user: want name:password"},
		{"cert without key", []string{"--cert", "c.pem", "status", "shoe"}, "--cert and --key must be given together"},
		{"missing cacert file", []string{"--cacert", "/nonexistent/ca.pem", "status", "shoe"}, "invalid --cacert"},
		{"lock without command", []string{"lock", "l1"}, "missing the command to run"},
		{"lock bad ttl", []string{"lock", "l1", "--ttl", "1500ms", "--", "true"}, "invalid --ttl 1.5s"},
		{"lock grace as long as the ttl", []string{"lock", "l1", "--ttl", "2s", "--grace", "2s", "--", "true"}, "invalid --grace 2s: must be positive and at most 416ms with --ttl 2s"},
		{"lock default ttl long grace", []string{"lock", "l1", "--grace", "5s", "--", "true"}, "invalid --grace 5s: must be positive and at most 3.083s with --ttl 10s"},
		{"lock grace just past the bound", []string{"lock", "l1", "--ttl", "4s", "--grace", "1084ms", "--", "true"}, "at most 1.083s with --ttl 4s"},
		{"lock zero grace", []string{"lock", "l1", "--grace", "0s", "--", "true"}, "invalid --grace 0s"},
		{"semaphore grace past the bound", []string{"semaphore", "s1", "--limit", "2", "--ttl", "2s", "--grace", "5s", "--", "true"}, "invalid --grace 5s: must be positive and at most 416ms with --ttl 2s"},
		{"lock bad name", []string{"lock", "a/b", "--", "true"}, "invalid lock NAME"},
		{"lock child flags before --", []string{"lock", "l1", "ls", "-l"}, "put the command to run after --"},
		{"rebalance without sku", []string{"rebalance"}, "missing SKU argument"},
		{"serve --listen with endpoints", []string{"serve", "--listen", "127.0.0.1:2379"}, "with --endpoints serve uses that etcd"},
		{"serve bad api addr", []string{"serve", "--api-addr", "7070"}, "invalid --api-addr"},
		{"serve api key without cert", []string{"serve", "--api-key", "k.pem"}, "--api-cert and --api-key must be given together"},
		{"serve public api", []string{"serve", "--api-addr", "0.0.0.0:7070"}, "refusing --api-addr 0.0.0.0:7070"},
		{"serve api inflight", []string{"serve", "--api-max-inflight", "0"}, "invalid --api-max-inflight 0"},
		{"demo bad qty range", []string{"demo", "--min-qty", "3", "--max-qty", "2"}, "invalid --min-qty 3 / --max-qty 2"},
		{"demo argument", []string{"demo", "now"}, "demo takes no arguments"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := e.run(tc.args...)
			checkFails(t, r, ExitUsage, tc.want, tc.args)
			if r.stdout != "" {
				t.Fatalf("stdout %q, want nothing", r.stdout)
			}
		})
	}
	if after := fingerprint(t, e.prefix); !maps.Equal(before, after) {
		t.Fatalf("bad inputs changed keys under %s:\nbefore %v\nafter  %v", e.prefix, before, after)
	}
	var stAfter statusView
	e.json(&stAfter, "status", "shoe")
	// The shared etcd's revision and database size move with other tests.
	stAfter.Revision, stAfter.Etcd = stBefore.Revision, stBefore.Etcd
	if fmt.Sprint(stAfter) != fmt.Sprint(stBefore) {
		t.Fatalf("status changed:\nbefore %+v\nafter  %+v", stBefore, stAfter)
	}
}

// A bad input without --endpoints fails before the embedded etcd starts:
// no data dir appears.
func TestBadInputStartsNothing(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "data")
	args := []string{"--data-dir", dir, "allocate", "shoe", "--order", "o1", "--qty", "0"}
	checkFails(t, run(t, args...), ExitUsage, "invalid qty 0", args)
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Fatalf("data dir %s exists after a bad input: %v", dir, err)
	}
}

func TestExitCodes(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.ok("init", "hat", "--total", "3", "--segments", "2")
	e.ok("init", "scarf", "--total", "3", "--segments", "1")
	e.ok("allocate", "hat", "--order", "h1", "--qty", "2")

	// 3: insufficient stock, naming what was wanted and what was left.
	e.fails(ExitInsufficientStock, "insufficient stock: want 2, have 1", "allocate", "hat", "--order", "h2", "--qty", "2")
	e.ok("allocate", "hat", "--order", "h3", "--qty", "1")
	e.fails(ExitInsufficientStock, "insufficient stock: want 1, have 0", "allocate", "hat", "--order", "h4", "--qty", "1")

	// 4: not found.
	for _, args := range [][]string{
		{"status", "nope"}, {"audit", "nope"}, {"allocate", "nope", "--order", "n1", "--qty", "1"},
		{"release", "nope", "--order", "h1"}, {"restock", "nope", "--delivery", "d1", "--qty", "1"}, {"rebalance", "nope"},
	} {
		e.fails(ExitNotFound, `nope`, args...)
		e.fails(ExitNotFound, `: unknown SKU`, args...)
	}
	e.fails(ExitNotFound, `failed to release hat order "h9": order not found`, "release", "hat", "--order", "h9")

	// 5: conflict.
	e.fails(ExitConflict, "the SKU already exists", "init", "hat", "--total", "3", "--segments", "2")
	e.fails(ExitConflict, `hat order "h1": conflict: the order was already applied with qty 2, not 1`, "allocate", "hat", "--order", "h1", "--qty", "1")
	e.fails(ExitConflict, `hat order "h1": conflict: the order was already applied for buyer "", not "bo"`, "allocate", "hat", "--order", "h1", "--qty", "2", "--buyer", "bo")
	e.ok("restock", "hat", "--delivery", "dn-1", "--qty", "4")
	e.fails(ExitConflict, `delivery "dn-1" was already applied with qty 4, not 5`, "restock", "hat", "--delivery", "dn-1", "--qty", "5")
}

// Invariant: an audit that finds the books out of balance exits 1, after
// printing the report.
func TestAuditFailureExits1(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.ok("init", "sock", "--total", "10", "--segments", "2", "--initial-fill", "4")
	space, err := keys.New(e.prefix)
	if err != nil {
		t.Fatal(err)
	}
	// Someone edits the pool behind stockctl's back: 6 becomes 7.
	if _, err := shared.client.Put(t.Context(), space.Pool("sock"), `{"v":1,"n":7}`); err != nil {
		t.Fatal(err)
	}
	r := e.run("-o", "json", "audit", "sock")
	checkFails(t, r, ExitFailure, "audit of sock failed", []string{"audit", "sock"})
	var au auditView
	decode(t, r.stdout, &au)
	if au.OK || len(au.Problems) == 0 || !strings.Contains(au.Problems[0], "books do not balance") {
		t.Fatalf("audit: %+v", au)
	}
}

func TestUnreachableEtcdExits1(t *testing.T) {
	t.Parallel()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close() // nothing listens there now
	args := []string{"--endpoints", "http://" + addr, "--dial-timeout", "500ms", "status", "x"}
	start := time.Now()
	r := run(t, args...)
	checkFails(t, r, ExitFailure, "failed to reach etcd at http://"+addr, args)
	if !strings.Contains(r.stderr, "--dial-timeout 500ms") {
		t.Fatalf("stderr %q does not say the dial timeout ran out", r.stderr)
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Fatalf("took %v to give up", took)
	}
}

func TestTimeoutNamesItself(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	// Hold the lock so that the command waits for it until --timeout.
	holder := e.startLockHolder("busy")
	defer holder()
	r := e.run("--timeout", "700ms", "lock", "busy", "--", "true")
	checkFails(t, r, ExitFailure, "failed to acquire lock busy", []string{"lock", "busy"})
	if !strings.Contains(r.stderr, "gave up after --timeout 700ms") {
		t.Fatalf("stderr %q does not name the timeout", r.stderr)
	}
}

func TestHelpAndNoCommand(t *testing.T) {
	t.Parallel()
	r := run(t, "--help")
	if r.code != 0 || !strings.Contains(r.stdout, "COMMANDS:") || !strings.Contains(r.stdout, "STOCKCTL_ENDPOINTS") {
		t.Fatalf("--help: exit %d, stdout %q", r.code, r.stdout)
	}
	r = run(t, "allocate", "--help")
	if r.code != 0 || !strings.Contains(r.stdout, "--route-key") {
		t.Fatalf("allocate --help: exit %d, stdout %q", r.code, r.stdout)
	}
	r = run(t, "help", "lock")
	if r.code != 0 || !strings.Contains(r.stdout, "STOCKCTL_FENCING_TOKEN") {
		t.Fatalf("help lock: exit %d, stdout %q", r.code, r.stdout)
	}
	r = run(t)
	if r.code != ExitUsage || r.stdout != "" || !strings.Contains(r.stderr, "COMMANDS:") || !strings.HasSuffix(r.stderr, "stockctl: no command given\n") {
		t.Fatalf("no command: exit %d, stdout %q, stderr %q; want 2 and the help on stderr", r.code, r.stdout, r.stderr)
	}
}

// Every global flag can come from the environment.
func TestEnvironmentVariables(t *testing.T) {
	e := newEnv(t)
	t.Setenv("STOCKCTL_ENDPOINTS", shared.endpoints)
	t.Setenv("STOCKCTL_PREFIX", e.prefix)
	t.Setenv("STOCKCTL_OUTPUT", "json")
	t.Setenv("STOCKCTL_TIMEOUT", "20s")
	r := run(t, "init", "env", "--total", "4", "--segments", "2")
	if r.code != 0 {
		t.Fatalf("init from env: %+v", r)
	}
	var v skuView
	decode(t, r.stdout, &v)
	if v.SKU != "env" || v.Total != 4 {
		t.Fatalf("init: %+v", v)
	}
	t.Setenv("STOCKCTL_USER", "justaname")
	checkFails(t, run(t, "status", "env"), ExitUsage, "invalid --user", nil)
}

// startLockHolder holds a named lock under the test's prefix from another
// "process" until the returned func is called.
func (e *env) startLockHolder(name string) func() {
	e.t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var out, errOut syncBuffer
	done := make(chan int, 1)
	ready := filepath.Join(e.t.TempDir(), "holding")
	go func() {
		done <- runCtx(ctx, &out, &errOut, e.args("--timeout", "0", "lock", name, "--", "sh", "-c", "touch "+ready+"; sleep 60")...)
	}()
	etcdtest.WaitFor(e.t, "the holder to take lock "+name, 20*time.Second, func() bool {
		_, err := os.Stat(ready)
		return err == nil
	})
	return func() {
		cancel()
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			e.t.Errorf("lock holder did not stop")
		}
	}
}
