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
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak: goroutines leaked:", err)
			code = 1
		}
	}
	os.Exit(code)
}
