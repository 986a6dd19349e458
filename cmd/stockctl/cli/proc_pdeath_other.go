//go:build unix && !linux

package cli

import "syscall"

// setParentDeathSignal does nothing: only Linux has a parent-death signal.
// The lock watcher (lockwatcher_unix.go) stops CMD when stockctl dies.
func setParentDeathSignal(*syscall.SysProcAttr) {}
