//go:build unix

package cli

import (
	"os"
	"os/exec"
	"syscall"
)

// lockSignals are the signals lock handles like SIGINT and SIGTERM: each
// would otherwise end stockctl at once (Go's default) and leave CMD running
// without the lock. SIGQUIT then no longer dumps goroutines.
var lockSignals = []os.Signal{syscall.SIGHUP, syscall.SIGQUIT}

// setProcessGroup puts cmd in a process group of its own if own is set,
// and asks the kernel to kill it when stockctl dies (where it can).
func setProcessGroup(cmd *exec.Cmd, own bool) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: own}
	setParentDeathSignal(cmd.SysProcAttr)
}

// signalChild signals process group pgid (CMD's, when it has its own:
// pgid > 0) or else cmd.
func signalChild(cmd *exec.Cmd, pgid int, sig syscall.Signal) {
	if pgid > 0 {
		_ = syscall.Kill(-pgid, sig)
		return
	}
	_ = cmd.Process.Signal(sig)
}
