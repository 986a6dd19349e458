package cli

import "syscall"

// setParentDeathSignal has the kernel send CMD SIGKILL when the thread that
// started it ends: stockctl's death, however it dies (startChild keeps that
// thread for CMD's whole run). Such a death cannot stop CMD gracefully, and
// the lock may lapse at any moment after it.
func setParentDeathSignal(a *syscall.SysProcAttr) { a.Pdeathsig = syscall.SIGKILL }
