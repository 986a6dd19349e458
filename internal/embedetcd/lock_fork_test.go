//go:build linux || darwin || freebsd || netbsd || openbsd || dragonfly

package embedetcd

import (
	"context"
	"errors"
	"sync"
	"syscall"
	"testing"
	"time"
)

// A restart in a process that starts children (issue 28: "data dir is in
// use … held by pid" of the test process itself, after a single member's
// restart on a busy machine): a child between fork and exec holds a copy
// of every descriptor, the lock's too, so the flock outlives Close until
// the child execs. The restart waits for that copy instead of failing; a
// copy is made here with dup, as fork makes it. A live Server of this
// process, or another process (TestSecondProcessGetsErrDataDirInUse), still
// fails at once.
func TestRestartWaitsForAForkedCopyOfTheLock(t *testing.T) {
	dir := t.TempDir()
	first := startT(t, Config{Dir: dir, UnsafeNoFsync: true})
	fd, err := syscall.Dup(int(first.lock.Fd()))
	if err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	closeCopy := func() { once.Do(func() { syscall.Close(fd) }) }
	defer closeCopy()
	first.Close()

	waiting := make(chan struct{}, 1)
	lockWaitHook = func() {
		select {
		case waiting <- struct{}{}:
		default:
		}
	}
	defer func() { lockWaitHook = nil }()
	type started struct {
		s   *Server
		err error
	}
	done := make(chan started, 1)
	go func() {
		s, err := Start(context.Background(), Config{Dir: dir, UnsafeNoFsync: true})
		done <- started{s, err}
	}()
	select {
	case <-waiting: // it found the copy and waits: the child execs now
		closeCopy()
	case r := <-done:
		if r.s != nil {
			r.s.Close()
		}
		t.Fatalf("restart while a forked copy of the lock lived: %v, want it to wait for the copy", r.err)
	case <-time.After(time.Minute):
		t.Fatal("restart neither waited nor returned")
	}
	r := <-done
	if r.err != nil {
		t.Fatalf("restart after the copy closed: %v", r.err)
	}
	defer r.s.Close()
	put(t, newClient(t, r.s), "k", "after-restart")

	// A live Server of this process is not waited for.
	start := make(chan error, 1)
	go func() {
		s, err := Start(context.Background(), Config{Dir: dir, UnsafeNoFsync: true})
		if s != nil {
			s.Close()
		}
		start <- err
	}()
	select {
	case err := <-start:
		if !errors.Is(err, ErrDataDirInUse) {
			t.Fatalf("second Start beside a live Server: %v, want ErrDataDirInUse", err)
		}
	case <-waiting:
		t.Fatal("second Start beside a live Server waits for it, as for a forked copy")
	}
}
