//go:build !(linux || darwin || freebsd || netbsd || openbsd || dragonfly)

package embedetcd

import (
	"fmt"
	"os"
	"runtime"
)

// lockDir refuses to run where flock is unavailable: without the lock a second
// process could open the same data dir and hang on bbolt's lock or corrupt it.
func lockDir(dir string) (*os.File, error) {
	return nil, fmt.Errorf("embedetcd: locking data dir %s: not supported on %s", dir, runtime.GOOS)
}

// unlockDir releases a lock taken by lockDir.
func unlockDir(f *os.File) { f.Close() }
