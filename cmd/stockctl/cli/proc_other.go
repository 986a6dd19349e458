//go:build !unix

package cli

import (
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
func signalChild(cmd *exec.Cmd, ownGroup bool, sig syscall.Signal) {
	if sig == syscall.SIGKILL {
		_ = cmd.Process.Kill()
		return
	}
	_ = cmd.Process.Signal(sig)
}

// startGuard has no watcher here: CMD may outlive a stockctl that is killed.
func startGuard(grace time.Duration) (arm func(cmd *exec.Cmd, ownGroup bool), release func(), err error) {
	return func(*exec.Cmd, bool) {}, func() {}, nil
}
