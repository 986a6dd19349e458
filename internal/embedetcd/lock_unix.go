//go:build linux || darwin || freebsd || netbsd || openbsd || dragonfly

package embedetcd

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// lockFileName is the file in the data dir that carries the flock. It is
// never removed: deleting a lock file while another process may be about to
// open it would let two processes each hold a lock on a different inode.
const lockFileName = "stockctl.lock"

// lockDir takes an exclusive, non-blocking flock on <dir>/stockctl.lock.
//
// flock locks belong to the open file description, so a second lockDir on the
// same dir fails even inside the same process, which is what keeps two Servers
// in one test binary from sharing a data dir. The lock is released when the
// returned file is closed, or by the kernel if the process dies.
func lockDir(dir string) (*os.File, error) {
	path := filepath.Join(dir, lockFileName)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("embedetcd: open lock file %s: %w", path, err)
	}
	for {
		err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if !errors.Is(err, syscall.EINTR) {
			break
		}
	}
	if err != nil {
		holder := readHolder(f)
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("%w: %s%s", ErrDataDirInUse, dir, holder)
		}
		return nil, fmt.Errorf("embedetcd: lock %s: %w", path, err)
	}
	// The pid is only a hint for the error message of whoever comes next; the
	// flock, not the file content, is what excludes them.
	if err := f.Truncate(0); err == nil {
		_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	return f, nil
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
