//go:build !linux

package e2e

import "os/exec"

// setDeathSignal is a no-op where the kernel has no parent-death signal;
// helpers still exit by themselves after their MaxLifeSec.
func setDeathSignal(*exec.Cmd) {}
