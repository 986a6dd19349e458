package e2e

import (
	"os/exec"
	"syscall"
)

// setDeathSignal makes the kernel SIGKILL a helper if the test process dies
// first, so that no helper outlives a crashed test run.
func setDeathSignal(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
