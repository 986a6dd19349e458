package e2e

import (
	"os"
	"testing"

	"go.uber.org/goleak"
)

// TestMain runs a helper process when the test binary was started as one
// (helperEnv set), and otherwise the tests, failing the package if any
// goroutine outlives them.
func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) != "" {
		os.Exit(helperMain())
	}
	goleak.VerifyTestMain(m,
		// A stopped cluster member leaves its peers' HTTP keep-alive
		// connections (etcd's rafthttp) open until the kernel notices; they
		// belong to etcd's peer transport, not to anything stockctl runs.
		goleak.IgnoreAnyFunction("net/http.(*persistConn).readLoop"),
		goleak.IgnoreAnyFunction("net/http.(*persistConn).writeLoop"),
		goleak.IgnoreAnyFunction("net/http.(*conn).serve"),
		goleak.IgnoreAnyFunction("net/http.(*connReader).backgroundRead"), // as in coordinator and feed
	)
}
