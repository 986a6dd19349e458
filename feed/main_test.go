package feed_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package if any goroutine outlives the tests: every
// feed, coordinator and embedded etcd must be shut down.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// A stopped cluster member leaves its peers' HTTP keep-alive
		// connections (etcd's rafthttp) open until the kernel notices; they
		// belong to etcd's peer transport, not to anything a feed runs (as
		// in e2e).
		goleak.IgnoreAnyFunction("net/http.(*persistConn).readLoop"),
		goleak.IgnoreAnyFunction("net/http.(*persistConn).writeLoop"),
		goleak.IgnoreAnyFunction("net/http.(*conn).serve"),
		goleak.IgnoreAnyFunction("net/http.(*connReader).backgroundRead"),
	)
}
