//go:build unix

package cli

import (
	"os/exec"
	"syscall"
)

// setProcessGroup puts cmd in a process group of its own if own is set.
func setProcessGroup(cmd *exec.Cmd, own bool) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: own}
}

// signalChild signals cmd's process group (when it has its own) or cmd.
func signalChild(cmd *exec.Cmd, ownGroup bool, sig syscall.Signal) {
	if ownGroup {
		_ = syscall.Kill(-cmd.Process.Pid, sig)
		return
	}
	_ = cmd.Process.Signal(sig)
}
