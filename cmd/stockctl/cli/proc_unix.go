//go:build unix

package cli

import (
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"syscall"
	"time"
)

// lockSignals are the signals lock handles like SIGINT and SIGTERM: each
// would otherwise end stockctl at once (Go's default) and leave CMD running
// without the lock. SIGQUIT then no longer dumps goroutines.
var lockSignals = []os.Signal{syscall.SIGHUP, syscall.SIGQUIT}

// setProcessGroup puts cmd in a process group of its own if own is set,
// and asks the kernel to kill it when stockctl dies (where it can).
func setProcessGroup(cmd *exec.Cmd, own bool) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: own}
	setParentDeathSignal(cmd.SysProcAttr)
}

// signalChild signals cmd's process group (when it has its own) or cmd.
func signalChild(cmd *exec.Cmd, ownGroup bool, sig syscall.Signal) {
	if ownGroup {
		_ = syscall.Kill(-cmd.Process.Pid, sig)
		return
	}
	_ = cmd.Process.Signal(sig)
}

// guardScript is the watcher's: it waits on a pipe whose only writer is
// stockctl. stockctl starts it before CMD, so that no kill of stockctl
// finds CMD running unwatched, and then writes CMD's target (its process
// group, or CMD) as the first line. A second line means stockctl is done
// with CMD (it stopped it, or CMD exited): nothing to do. End of file
// without one means stockctl died without stopping CMD (SIGKILL, a crash):
// the kernel closed the pipe. Then it stops the target as a lost lock does:
// SIGTERM, then SIGKILL $1 seconds later. The SIGKILL is timed by one sleep
// started at once, not by counting polls, which a busy machine would slow
// down: the lease lapses on time whatever the load, and the kill must come
// first. The poll (at most $2 times, more than $1 seconds) only ends the
// watcher, and the timer, early when the target is gone.
const guardScript = `read -r t || exit 0
read -r _ && exit 0
kill -s TERM -- "$t" 2>/dev/null || exit 0
{ sleep "$1"; kill -s KILL -- "$t" 2>/dev/null; } &
k=$!
i=0
while [ "$i" -lt "$2" ] && kill -s 0 -- "$t" 2>/dev/null; do sleep 0.1; i=$((i + 1)); done
kill -s 0 -- "$t" 2>/dev/null || kill "$k" 2>/dev/null
wait
exit 0`

// startGuard starts a watcher process that will stop CMD (its process
// group when it has its own, so that what CMD started goes too) if
// stockctl dies without doing so: a parent-death signal reaches only CMD
// itself, and only on Linux. Call it before CMD starts, then arm with CMD
// once it runs, and release on every path where stockctl has dealt with
// CMD (or could not start it); release tells the watcher to exit, and
// waits for it. The watcher is /bin/sh, in a process group of its own so
// that signals meant for CMD's group or the terminal's do not reach it.
func startGuard(grace time.Duration) (arm func(cmd *exec.Cmd, ownGroup bool), release func(), err error) {
	r, w, err := os.Pipe() // close-on-exec: CMD never holds the write end
	if err != nil {
		return func(*exec.Cmd, bool) {}, func() {}, err
	}
	ms := grace.Milliseconds()
	secs := fmt.Sprintf("%d.%03d", ms/1000, ms%1000)
	polls := strconv.FormatInt(ms/100+10, 10)
	g := exec.Command("/bin/sh", "-c", guardScript, "stockctl-lock-guard", secs, polls)
	g.Stdin = r
	g.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	err = g.Start()
	r.Close()
	if err != nil {
		w.Close()
		return func(*exec.Cmd, bool) {}, func() {}, fmt.Errorf("start the watcher of CMD: %w", err)
	}
	arm = func(cmd *exec.Cmd, ownGroup bool) {
		target := strconv.Itoa(cmd.Process.Pid)
		if ownGroup {
			target = "-" + target
		}
		_, _ = w.Write([]byte(target + "\n"))
	}
	return arm, func() {
		// A line after the target says done; before it, end of file does.
		_, _ = w.Write([]byte("done\n"))
		w.Close()
		_ = g.Wait()
	}, nil
}
