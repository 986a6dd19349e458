//go:build linux || darwin || freebsd || netbsd || openbsd || dragonfly

package embedetcd

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// lockFileName is the file in the data dir that carries the flock. It is
// never removed: deleting a lock file while another process may be about to
// open it would let two processes each hold a lock on a different inode.
const lockFileName = "stockctl.lock"

// forkCopyWait bounds how long lockDir waits for a lock that this process
// no longer holds but a child it is starting still does (see lockDir).
const forkCopyWait = 10 * time.Second

// lockWaitHook, if set (by tests), runs each time lockDir waits for a fork's
// copy of the lock.
var lockWaitHook func()

// heldDirs are the data dirs this process's live Servers hold, by the
// lock file's absolute path.
var heldDirs = struct {
	sync.Mutex
	m map[string]bool
}{m: map[string]bool{}}

// lockDir takes an exclusive, non-blocking flock on <dir>/stockctl.lock.
//
// flock locks belong to the open file description, so a second lockDir on the
// same dir fails even inside the same process, which is what keeps two Servers
// in one test binary from sharing a data dir. The lock is released when the
// returned file is closed (call unlockDir), or by the kernel if the process
// dies.
//
// A fork copies every descriptor, close-on-exec ones too, until the child
// execs: a process that starts children (a test binary running stockctl,
// sh, tmux) while it restarts a Server would find the lock it just released
// still held, by its own pid, for as long as a child takes from fork to exec
// (long on a busy machine: issue 28's "data dir is in use … held by pid" of
// the test process itself after a restart of a single member). So a lock
// held by this process's pid but by none of its live Servers (heldDirs) is
// waited for, up to forkCopyWait; another process's, or a live Server's,
// fails at once.
func lockDir(dir string) (*os.File, error) {
	path := filepath.Join(dir, lockFileName)
	abs, err := filepath.Abs(path)
	if err != nil {
		abs = path
	}
	heldDirs.Lock()
	mine := heldDirs.m[abs]
	heldDirs.Unlock()
	if mine {
		return nil, fmt.Errorf("%w: %s (held by this process, pid %d)", ErrDataDirInUse, dir, os.Getpid())
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("embedetcd: open lock file %s: %w", path, err)
	}
	deadline := time.Now().Add(forkCopyWait)
	for {
		err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if errors.Is(err, syscall.EINTR) {
			continue
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) || holderPid(f) != os.Getpid() || time.Now().After(deadline) {
			break
		}
		heldDirs.Lock()
		mine = heldDirs.m[abs]
		heldDirs.Unlock()
		if mine {
			break // a Server of this process took it meanwhile
		}
		if lockWaitHook != nil {
			lockWaitHook()
		}
		time.Sleep(10 * time.Millisecond) // a child between fork and exec
	}
	if err != nil {
		holder := readHolder(f)
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("%w: %s%s", ErrDataDirInUse, dir, holder)
		}
		return nil, fmt.Errorf("embedetcd: lock %s: %w", path, err)
	}
	heldDirs.Lock()
	heldDirs.m[abs] = true
	heldDirs.Unlock()
	// The pid is only a hint for the error message of whoever comes next; the
	// flock, not the file content, is what excludes them.
	if err := f.Truncate(0); err == nil {
		_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	return f, nil
}

// unlockDir releases a lock taken by lockDir.
func unlockDir(f *os.File) {
	abs, err := filepath.Abs(f.Name())
	if err != nil {
		abs = f.Name()
	}
	f.Close()
	heldDirs.Lock()
	delete(heldDirs.m, abs)
	heldDirs.Unlock()
}

// holderPid is the pid in the lock file, or 0.
func holderPid(f *os.File) int {
	buf := make([]byte, 32)
	n, _ := f.ReadAt(buf, 0)
	pid, _ := strconv.Atoi(strings.TrimSpace(string(buf[:n])))
	return pid
}

// readHolder returns " (held by pid N)" from the lock file, or "" when the
// file carries no pid (for example while the holder is still writing it).
func readHolder(f *os.File) string {
	buf := make([]byte, 32)
	n, _ := f.ReadAt(buf, 0)
	pid := strings.TrimSpace(string(buf[:n]))
	if _, err := strconv.Atoi(pid); err != nil {
		return ""
	}
	return " (held by pid " + pid + ")"
}
