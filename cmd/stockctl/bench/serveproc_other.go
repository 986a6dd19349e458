//go:build !linux

package bench

import "os/exec"

// setDeathSignal does nothing where the kernel cannot kill a child with
// its parent: Teardown stops the serve processes.
func setDeathSignal(*exec.Cmd) {}
