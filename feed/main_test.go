package feed_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package if any goroutine outlives the tests: every
// feed, coordinator and embedded etcd must be shut down.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
