//go:build !linux

package etcdtest

import (
	"context"
	"fmt"
	"runtime"
	"syscall"
)

// sysProcAttr: only Linux can tie etcd's life to the test binary's; here a
// test binary killed before its cleanups run leaves etcd behind.
func sysProcAttr() *syscall.SysProcAttr { return nil }

// lockFile is only needed to install Debian's etcd-server, which happens on
// Linux only.
func lockFile(context.Context, string) (func(), error) {
	return nil, fmt.Errorf("installing etcd is not supported on %s", runtime.GOOS)
}
