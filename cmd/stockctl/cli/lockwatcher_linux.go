package cli

import (
	"os"
	"strconv"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// monoNow is CLOCK_MONOTONIC, the clock Go's timers and etcd's lease
// expiry run on, the same in every process of the machine: stockctl reads
// the time it sent a renewal on it, the watcher its kill-by time.
func monoNow() time.Duration {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		panic("clock_gettime(CLOCK_MONOTONIC): " + err.Error())
	}
	return time.Duration(ts.Nano())
}

// watcherNice is the nice value the watcher asks for, so that a busy
// machine wakes it sooner when its kill is due.
const watcherNice = -10

// raisePriority gives every thread of the watcher watcherNice, where the
// user may (root, CAP_SYS_NICE, or RLIMIT_NICE); else it leaves them as
// they are. Linux keeps a nice value per thread, and a new thread takes its
// creator's: so each existing one is set.
func raisePriority() {
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		return
	}
	for _, t := range tasks {
		if tid, err := strconv.Atoi(t.Name()); err == nil {
			_ = syscall.Setpriority(syscall.PRIO_PROCESS, tid, watcherNice)
		}
	}
}
