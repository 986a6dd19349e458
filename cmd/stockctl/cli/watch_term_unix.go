//go:build linux || darwin || freebsd

package cli

import (
	"io"
	"os"
	"syscall"
	"unsafe"
)

// terminalSize is the size of the terminal w writes to, in rows and
// columns; 0, 0 when w is not a terminal or its size is unknown.
func terminalSize(w io.Writer) (rows, cols int) {
	f, ok := w.(*os.File)
	if !ok {
		return 0, 0
	}
	conn, err := f.SyscallConn()
	if err != nil {
		return 0, 0
	}
	var ws struct{ row, col, xpixel, ypixel uint16 }
	var errno syscall.Errno
	if err := conn.Control(func(fd uintptr) {
		_, _, errno = syscall.Syscall(syscall.SYS_IOCTL, fd, uintptr(syscall.TIOCGWINSZ), uintptr(unsafe.Pointer(&ws)))
	}); err != nil || errno != 0 {
		return 0, 0
	}
	return int(ws.row), int(ws.col)
}
