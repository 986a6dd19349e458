package coordinator_test

import (
	"fmt"
	"os"
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package if any goroutine outlives the tests: every
// coordinator, session, watch and embedded etcd must be shut down (the
// examples' etcds are stopped first).
func TestMain(m *testing.M) {
	code := m.Run()
	stopExampleServers()
	if code == 0 {
		if err := goleak.Find(
			// A stopped cluster member leaves its peers' HTTP keep-alive
			// connections (etcd's rafthttp) open until the kernel notices;
			// they belong to etcd's peer transport (as in e2e and feed).
			goleak.IgnoreAnyFunction("net/http.(*persistConn).readLoop"),
			goleak.IgnoreAnyFunction("net/http.(*persistConn).writeLoop"),
			goleak.IgnoreAnyFunction("net/http.(*conn).serve"),
			goleak.IgnoreAnyFunction("net/http.(*connReader).backgroundRead"),
		); err != nil {
			fmt.Fprintln(os.Stderr, "goleak: goroutines leaked:", err)
			code = 1
		}
	}
	os.Exit(code)
}
