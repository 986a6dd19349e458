package cli

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"
	"go.uber.org/zap"

	"github.com/stockctl/stockctl/internal/embedetcd"
)

// shared is one embedded etcd for most tests of the package: starting one
// per test would cost more than the tests. Each test works under a prefix
// of its own, so tests run in parallel without seeing each other.
var shared struct {
	endpoints string
	client    *clientv3.Client
}

// testTempDir is removed after the tests: what they build or keep for
// the whole test binary goes there (the built stockctl).
var testTempDir string

func TestMain(m *testing.M) {
	if isLockWatcher(os.Args) {
		// In-process `stockctl lock` runs this binary as its watcher.
		os.Exit(runLockWatcher(os.Args, os.Stdin, os.Stdout))
	}
	os.Exit(testMain(m))
}

func testMain(m *testing.M) int {
	dir, err := os.MkdirTemp("", "stockctl-cli-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	if testTempDir, err = os.MkdirTemp("", "stockctl-cli-test-bin-"); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(testTempDir)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	srv, err := embedetcd.Start(ctx, embedetcd.Config{Dir: dir, UnsafeNoFsync: true})
	if err != nil {
		fmt.Fprintln(os.Stderr, "start the shared etcd:", err)
		return 1
	}
	shared.endpoints = srv.Endpoints()[0]
	shared.client, err = clientv3.New(clientv3.Config{Endpoints: srv.Endpoints(), DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		srv.Close()
		fmt.Fprintln(os.Stderr, "shared client:", err)
		return 1
	}
	code := m.Run()
	shared.client.Close()
	srv.Close()
	if code == 0 {
		// Every command must close its coordinator, clients, watches and
		// embedded etcd; a lock's child watcher must end with it.
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goroutines leaked:", err)
			return 1
		}
	}
	return code
}
