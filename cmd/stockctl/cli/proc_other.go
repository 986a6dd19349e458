//go:build !unix

package cli

import (
	"io"
	"os"
	"os/exec"
	"syscall"
	"time"
)

// lockSignals: no signals beyond SIGINT and SIGTERM here.
var lockSignals []os.Signal

// setProcessGroup does nothing where process groups are not available.
func setProcessGroup(cmd *exec.Cmd, own bool) {}

// signalChild signals cmd; SIGTERM may not be deliverable here, in which
// case the escalation to SIGKILL does the job.
func signalChild(cmd *exec.Cmd, pgid int, sig syscall.Signal) {
	if sig == syscall.SIGKILL {
		_ = cmd.Process.Kill()
		return
	}
	_ = cmd.Process.Signal(sig)
}

// lockWatcher: there is no watcher here; startLockWatcher returns none,
// and CMD may outlive a stockctl that is killed.
type lockWatcher struct{}

func startLockWatcher(time.Duration, bool) (*lockWatcher, error) { return nil, nil }
func (*lockWatcher) joinGroup(*exec.Cmd)                         {}
func (*lockWatcher) pgid() int                                   { return 0 }
func (*lockWatcher) setTarget(int)                               {}
func (*lockWatcher) setKillBy(time.Duration)                     {}
func (*lockWatcher) release()                                    {}

// isLockWatcher is false here: there is no watcher.
func isLockWatcher([]string) bool { return false }

// runLockWatcher is never run here.
func runLockWatcher([]string, io.Reader, io.Writer) int { return ExitUsage }

// monoNow is the wall clock here, as nanoseconds since 1970.
func monoNow() time.Duration { return time.Duration(time.Now().UnixNano()) }
