package etcdtest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"time"
)

// sysProcAttr makes the kernel kill etcd when the test binary dies without
// running its cleanups (go test's -timeout panics, a SIGKILL): a server left
// behind would hold its ports and data dir on a shared machine for good.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}

// lockFile takes an exclusive flock on name in os.TempDir(), which every
// test binary on the machine sees, waiting for it until ctx ends. The lock
// goes with the process if it dies holding it.
func lockFile(ctx context.Context, name string) (unlock func(), err error) {
	path := filepath.Join(os.TempDir(), name)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open lock file %s: %w", path, err)
	}
	// Non-blocking attempts in a loop, because a blocking flock cannot be
	// cancelled when ctx ends.
	for {
		err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			return func() { f.Close() }, nil
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) && !errors.Is(err, syscall.EINTR) {
			f.Close()
			return nil, fmt.Errorf("lock %s: %w", path, err)
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, fmt.Errorf("lock %s: held by another process: %w", path, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}
