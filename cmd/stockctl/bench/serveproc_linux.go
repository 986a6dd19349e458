package bench

import (
	"os/exec"
	"syscall"
)

// setDeathSignal makes the kernel kill a serve process if the bench dies
// first (^C twice, a crash), so that none outlives it.
func setDeathSignal(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
