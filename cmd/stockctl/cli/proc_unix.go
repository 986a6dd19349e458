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
// stockctl. A line means stockctl is done with CMD (it stopped it, or CMD
// exited): nothing to do. End of file without one means stockctl died
// without stopping CMD (SIGKILL, a crash): the kernel closed the pipe. Then
// it stops $1 (CMD's process group, or CMD) as a lost lock does: SIGTERM,
// then SIGKILL $2 seconds later. The SIGKILL is timed by one sleep started
// at once, not by counting polls, which a busy machine would slow down: the
// lease lapses on time whatever the load, and the kill must come first. The
// poll (at most $3 times, more than $2 seconds) only ends the watcher,
// and the timer, early when $1 is gone.
const guardScript = `read -r _ && exit 0
kill -s TERM -- "$1" 2>/dev/null || exit 0
{ sleep "$2"; kill -s KILL -- "$1" 2>/dev/null; } &
k=$!
i=0
while [ "$i" -lt "$3" ] && kill -s 0 -- "$1" 2>/dev/null; do sleep 0.1; i=$((i + 1)); done
kill -s 0 -- "$1" 2>/dev/null || kill "$k" 2>/dev/null
wait
exit 0`

// guardChild starts a watcher process that stops cmd (its process group
// when it has its own, so that what CMD started goes too) if stockctl dies
// without doing so: a parent-death signal reaches only CMD itself, and only
// on Linux. The watcher is /bin/sh, in a process group of its own so that
// signals meant for CMD's group or the terminal's do not reach it. Call
// release on every path where stockctl has dealt with CMD; it tells the
// watcher to exit, and waits for it.
func guardChild(cmd *exec.Cmd, ownGroup bool, grace time.Duration) (release func(), err error) {
	target := strconv.Itoa(cmd.Process.Pid)
	if ownGroup {
		target = "-" + target
	}
	r, w, err := os.Pipe() // close-on-exec: CMD never holds the write end
	if err != nil {
		return func() {}, err
	}
	ms := grace.Milliseconds()
	secs := fmt.Sprintf("%d.%03d", ms/1000, ms%1000)
	polls := strconv.FormatInt(ms/100+10, 10)
	g := exec.Command("/bin/sh", "-c", guardScript, "stockctl-lock-guard", target, secs, polls)
	g.Stdin = r
	g.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	err = g.Start()
	r.Close()
	if err != nil {
		w.Close()
		return func() {}, fmt.Errorf("start the watcher of %q: %w", cmd.Path, err)
	}
	return func() {
		_, _ = w.Write([]byte("done\n"))
		w.Close()
		_ = g.Wait()
	}, nil
}
