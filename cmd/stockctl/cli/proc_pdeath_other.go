//go:build unix && !linux

package cli

import "syscall"

// setParentDeathSignal does nothing: only Linux has a parent-death signal.
// guardChild's watcher stops CMD when stockctl dies.
func setParentDeathSignal(*syscall.SysProcAttr) {}
