//go:build unix

package cli

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// The lock watcher is a second process that stops CMD should stockctl die
// without doing so (SIGKILL, a crash), before the lease of the hold can
// lapse and the next holder start. It is stockctl itself, run again under
// the name lockWatcherName (isLockWatcher, runLockWatcher).
//
// Protocol, on the watcher's stdin, one line each (stockctl is its only
// writer, so end of file without "done" means stockctl died: the kernel
// closed the pipe):
//
//	kill-by N   SIGKILL the target by N, a CLOCK_MONOTONIC time in ns
//	target PID  the target is process PID, not the watcher's group
//	done        stockctl has dealt with CMD: exit
//
// The watcher says "ready" on its stdout once it listens; stockctl starts
// CMD only then. In the usual mode CMD runs in the watcher's process group
// (the watcher leads it, and ignores the signals stockctl sends it), so the
// watcher knows its target before CMD runs: no kill of stockctl, however
// early, leaves what CMD started unwatched.
const lockWatcherName = "stockctl-lock-watcher"

// isLockWatcher reports whether args (os.Args) run the lock watcher.
func isLockWatcher(args []string) bool {
	return len(args) > 0 && args[0] == lockWatcherName
}

// runLockWatcher is the lock watcher's main: args are its argv (name,
// --grace, "group" or "pid"). It returns the exit status.
func runLockWatcher(args []string, in io.Reader, out io.Writer) int {
	if len(args) != 3 {
		fmt.Fprintln(os.Stderr, lockWatcherName+": want GRACE group|pid")
		return ExitUsage
	}
	grace, err := time.ParseDuration(args[1])
	if err != nil {
		fmt.Fprintln(os.Stderr, lockWatcherName+":", err)
		return ExitUsage
	}
	// In CMD's group it gets the SIGTERM meant for CMD; and a write to a
	// gone stockctl must fail, not kill it.
	signal.Ignore(syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP, syscall.SIGQUIT, syscall.SIGPIPE)
	raisePriority()
	target := 0 // the watcher's own group
	if args[2] == "pid" {
		target = -1 // none until told
	}
	if _, err := fmt.Fprintln(out, "ready"); err != nil {
		return ExitFailure // stockctl is gone before CMD started
	}
	var killBy time.Duration // 0: none known
	sc := bufio.NewScanner(in)
	for sc.Scan() {
		verb, arg, _ := strings.Cut(sc.Text(), " ")
		n, _ := strconv.ParseInt(arg, 10, 64)
		switch verb {
		case "done":
			return 0
		case "kill-by":
			killBy = time.Duration(n)
		case "target":
			target = int(n)
		}
	}
	// stockctl died without stopping CMD.
	if target < 0 {
		return 0 // it died before CMD ran, or Linux's parent-death signal killed CMD
	}
	kill := func(sig syscall.Signal) { _ = syscall.Kill(target, sig) }
	if target == 0 {
		kill = func(sig syscall.Signal) { _ = syscall.Kill(0, sig) } // our group: CMD's
	}
	kill(syscall.SIGTERM)
	// SIGKILL after --grace, or sooner at the kill-by time: that counts
	// from the last renewal etcd confirmed, not from when the watcher saw
	// the death, so a stockctl that was starved before it died, or a
	// watcher that woke late, leaves the kill no less margin before the
	// lease can lapse.
	at := monoNow() + grace
	if killBy > 0 {
		at = min(at, killBy)
	}
	if d := at - monoNow(); d > 0 {
		time.Sleep(d)
	}
	kill(syscall.SIGKILL) // in group mode, the watcher's last act
	return 0
}

// lockWatcher is stockctl's side of a running watcher.
type lockWatcher struct {
	proc *exec.Cmd
	mu   sync.Mutex // guards w and done: renewals and release write concurrently
	w    *os.File   // the watcher's stdin
	done bool       // w is closed
	wait sync.Once  // of proc
}

// startLockWatcher starts the watcher and waits until it listens. With
// group set, CMD is to join the watcher's process group (joinGroup); else
// the watcher leads a group of its own, so that signals meant for the
// terminal's group do not reach it, and must be told CMD's pid (setTarget).
// grace is --grace. Call release on every path once CMD is dealt with.
func startLockWatcher(grace time.Duration, group bool) (*lockWatcher, error) {
	r, w, err := os.Pipe() // close-on-exec: CMD never holds the write end
	if err != nil {
		return nil, fmt.Errorf("start the watcher of CMD: %w", err)
	}
	mode := "pid"
	if group {
		mode = "group"
	}
	g := exec.Command(selfExe(), grace.String(), mode)
	g.Args[0] = lockWatcherName
	g.Stdin = r
	g.Stderr = os.Stderr
	g.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	ready, err := g.StdoutPipe()
	if err == nil {
		err = g.Start()
	}
	r.Close()
	if err != nil {
		w.Close()
		return nil, fmt.Errorf("start the watcher of CMD: %w", err)
	}
	line, err := bufio.NewReader(ready).ReadString('\n')
	if err == nil && line != "ready\n" {
		err = fmt.Errorf("it said %q", line)
	}
	if err != nil {
		w.Close()
		_ = g.Process.Kill()
		_ = g.Wait()
		return nil, fmt.Errorf("start the watcher of CMD: %w", err)
	}
	return &lockWatcher{proc: g, w: w}, nil
}

// selfExe is this program's file, for running it again as the watcher:
// on Linux /proc/self/exe, which holds even if the file was replaced since.
func selfExe() string {
	if _, err := os.Stat("/proc/self/exe"); err == nil {
		return "/proc/self/exe"
	}
	if p, err := os.Executable(); err == nil {
		return p
	}
	return os.Args[0]
}

// joinGroup has cmd start in the watcher's process group.
func (lw *lockWatcher) joinGroup(cmd *exec.Cmd) {
	cmd.SysProcAttr.Setpgid = true
	cmd.SysProcAttr.Pgid = lw.proc.Process.Pid
}

// pgid is the process group CMD joins: the watcher's.
func (lw *lockWatcher) pgid() int { return lw.proc.Process.Pid }

// setTarget tells the watcher CMD's pid (when CMD is not in its group).
func (lw *lockWatcher) setTarget(pid int) { lw.send("target " + strconv.Itoa(pid)) }

// setKillBy tells the watcher the CLOCK_MONOTONIC time by which it must
// SIGKILL CMD should stockctl die.
func (lw *lockWatcher) setKillBy(t time.Duration) {
	lw.send("kill-by " + strconv.FormatInt(int64(t), 10))
}

func (lw *lockWatcher) send(line string) {
	lw.mu.Lock()
	defer lw.mu.Unlock()
	if !lw.done {
		_, _ = lw.w.Write([]byte(line + "\n"))
	}
}

// release tells the watcher stockctl is done with CMD and waits for it to
// exit. (A SIGKILL of CMD's group ended it already: the write fails, the
// wait returns.)
func (lw *lockWatcher) release() {
	lw.hangUp("done")
	lw.wait.Do(func() {
		var ee *exec.ExitError
		if err := lw.proc.Wait(); err != nil && !errors.As(err, &ee) {
			fmt.Fprintf(os.Stderr, "stockctl: warning: wait for the watcher of CMD: %v\n", err)
		}
	})
}

// hangUp closes the watcher's stdin, after the line last unless it is
// empty: without "done", the watcher takes it for stockctl's death.
func (lw *lockWatcher) hangUp(last string) {
	lw.mu.Lock()
	defer lw.mu.Unlock()
	if lw.done {
		return
	}
	lw.done = true
	if last != "" {
		_, _ = lw.w.Write([]byte(last + "\n"))
	}
	lw.w.Close()
}
