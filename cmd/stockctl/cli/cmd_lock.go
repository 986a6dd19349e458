package cli

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	ucli "github.com/urfave/cli/v2"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/stockctl/stockctl/coordinator"
)

// Defaults of lock's flags.
const (
	// DefaultLockTTL is the lease TTL of the lock: if stockctl dies or is
	// cut off, the lock is free again after at most this long.
	DefaultLockTTL = coordinator.DefaultSessionTTL
	// DefaultLockGrace is how long CMD gets to stop after SIGTERM, before
	// SIGKILL, unless MaxLockGrace of the TTL is less: then that.
	DefaultLockGrace = 5 * time.Second
)

// keepAliveTick is how often etcd's client looks for leases due for a
// keepalive (internal/lock's clientKeepAliveTick): it renews a lease at the
// first tick after a third of its TTL has passed since the last answer.
const keepAliveTick = 500 * time.Millisecond

// MaxLockGrace is the longest --grace a TTL allows: a third of the TTL less
// 250 ms (3.083s for the default 10s TTL, 416ms for etcd's minimum of 2s).
// If stockctl is SIGKILLed, its watcher sends CMD's group SIGTERM, then
// SIGKILL after --grace or at its kill-by time, whichever comes first: half
// the TTL after the last renewal stockctl sent and etcd confirmed, so that
// the next holder, who waits for the lease to expire, never runs beside
// what CMD started (lock_killby.go). stockctl renews every TTL/6, so the
// kill-by time is normally at least TTL/3 less a round trip ahead, and a
// grace within this bound is given whole while etcd answers within 250 ms.
func MaxLockGrace(ttl time.Duration) time.Duration {
	return ((ttl - ttl/3 - keepAliveTick) / 2).Truncate(time.Millisecond)
}

// Environment variables lock passes to CMD.
const (
	envLockName      = "STOCKCTL_LOCK_NAME"
	envLockKey       = "STOCKCTL_LOCK_KEY"
	envLockRevision  = "STOCKCTL_LOCK_REVISION"
	envFencingToken  = "STOCKCTL_FENCING_TOKEN"
	unlockTimeout    = 5 * time.Second
	lockStatusOnLoss = ExitFailure
)

func lockCommand() *ucli.Command {
	return &ucli.Command{
		Name:  "lock",
		Usage: "run a command while holding a named lock",
		Description: "Waits for the lock (up to --timeout; 0: no limit), then runs CMD with\n" +
			envLockName + ", " + envLockKey + " and " + envFencingToken + " in its environment, and exits\n" +
			"with CMD's status (128+N if a signal N killed it). If the lock is lost while CMD runs (the\n" +
			"lease expired or was revoked, the key was deleted), CMD and its process group get SIGTERM,\n" +
			"then SIGKILL after --grace, and stockctl exits 1. A lost lock means another holder may run:\n" +
			"have CMD's writes check the fencing token where they land.",
		ArgsUsage: "NAME [--ttl D] [--grace D] -- CMD [ARGS...]",
		Flags: []ucli.Flag{
			&ucli.DurationFlag{Name: "ttl", Value: DefaultLockTTL, EnvVars: []string{"STOCKCTL_LOCK_TTL"},
				Usage: "lease TTL, whole seconds: how long the lock outlives a dead or cut-off stockctl"},
			graceFlag("lock"),
			&ucli.BoolFlag{Name: "shared", EnvVars: []string{"STOCKCTL_LOCK_SHARED"},
				Usage: "hold the lock shared (a read lock): with other shared holders, never with an exclusive one"},
		},
		Action: lockAction,
	}
}

func lockAction(c *ucli.Context) error {
	return runHeld(c, "lock", "acquire lock ", nil, func(ctx context.Context, co *coordinator.Coordinator, name string) (*coordinator.Lock, error) {
		if c.Bool("shared") {
			return co.RLock(ctx, name)
		}
		return co.Lock(ctx, name)
	})
}

// runHeld is the action of lock and semaphore: NAME -- CMD from the
// arguments (noun names NAME in errors), --ttl and --grace checked after
// check (the command's own flags), the hold taken by acquire (bounded by
// --timeout and by the signals below; failure says doing and NAME), then
// CMD run while it lasts (runLocked), exiting with CMD's status.
func runHeld(c *ucli.Context, noun, doing string, check func() error, acquire func(context.Context, *coordinator.Coordinator, string) (*coordinator.Lock, error)) error {
	g, err := readGlobals(c)
	if err != nil {
		return err
	}
	usage := fmt.Sprintf("usage: stockctl %s %s", c.Command.Name, c.Command.ArgsUsage)
	args := c.Args().Slice()
	if len(args) == 0 {
		return usageError("missing NAME argument (%s)", usage)
	}
	name, argv := args[0], args[1:]
	if len(argv) > 0 && argv[0] == "--" {
		argv = argv[1:]
	}
	if err := coordinator.ValidateLockName(name); err != nil {
		return usageError("invalid %s NAME: %v", noun, err)
	}
	if len(argv) == 0 {
		return usageError("missing the command to run (%s)", usage)
	}
	if check != nil {
		if err := check(); err != nil {
			return err
		}
	}
	ttl, grace, err := holdTimes(c)
	if err != nil {
		return err
	}

	// SIGHUP and SIGQUIT too: left to Go's defaults, they would end
	// stockctl at once and leave CMD running without its hold.
	ctx, stop := signalContext(c, lockSignals...)
	defer stop()
	actx, cancel := g.boundedContext(ctx) // connecting and waiting for the hold
	defer cancel()
	cn, err := connect(actx, c, g, coordinator.WithSessionTTL(ttl))
	if err != nil {
		return err
	}
	defer cn.Close()
	l, err := acquire(actx, cn.coord, name)
	if err != nil {
		return failed(actx, doing+name, err)
	}
	cancel()
	code, err := runLocked(ctx, c, cn, l, argv, ttl, grace)
	if err != nil {
		return err
	}
	if code != 0 {
		return ucli.Exit("", code) // CMD's status; CMD said what went wrong
	}
	return nil
}

// graceFlag is lock's and semaphore's --grace; what (lock, permit) names
// the hold in its usage.
func graceFlag(what string) *ucli.DurationFlag {
	return &ucli.DurationFlag{Name: "grace", EnvVars: []string{"STOCKCTL_LOCK_GRACE"},
		Usage: "how long CMD gets between SIGTERM and SIGKILL when the " + what + " is lost or stockctl is stopped or killed; " +
			"at most a third of --ttl less 250ms, so that CMD is gone before the lease can lapse (default: 5s, or that bound if less)"}
}

// holdTimes reads and checks --ttl and --grace. An unset --grace is
// DefaultLockGrace bounded by MaxLockGrace(ttl); a set one above the bound
// is refused: CMD could then outlive the lease of a killed stockctl and run
// beside the next holder.
func holdTimes(c *ucli.Context) (ttl, grace time.Duration, err error) {
	ttl, grace = c.Duration("ttl"), c.Duration("grace")
	if ttl < time.Second || ttl%time.Second != 0 {
		return 0, 0, usageError("invalid --ttl %v: must be a whole number of seconds, at least 1s", ttl)
	}
	bound := MaxLockGrace(ttl)
	if !c.IsSet("grace") {
		return ttl, min(DefaultLockGrace, bound), nil
	}
	if grace <= 0 || grace > bound {
		return 0, 0, usageError("invalid --grace %v: must be positive and at most %v with --ttl %v (a third of the TTL less 250ms), "+
			"so that CMD is killed before the lease of a killed stockctl lapses and the next holder starts", grace, bound, ttl)
	}
	return ttl, grace, nil
}

// runLocked runs argv while l is held and returns its exit status, or an
// error if it could not run or the lock was lost.
func runLocked(ctx context.Context, c *ucli.Context, cn *conn, l *coordinator.Lock, argv []string, ttl, grace time.Duration) (int, error) {
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdin = c.App.Reader
	cmd.Stdout = c.App.Writer
	cmd.Stderr = c.App.ErrWriter
	cmd.Env = append(childEnviron(os.Environ()),
		envLockName+"="+l.Name(),
		envLockKey+"="+l.Key(),
		envFencingToken+"="+strconv.FormatInt(l.Token(), 10),
		envLockRevision+"="+strconv.FormatInt(l.Revision(), 10))
	// Its own process group, so that a lost lock stops everything CMD
	// started, unless CMD talks to our terminal (a background group could
	// not read it): then it shares our group and gets ^C from the terminal.
	ownGroup := !isTerminal(c.App.Reader)
	setProcessGroup(cmd, ownGroup)
	// If CMD's children keep its output pipes open after it exits, Wait
	// returns anyway after this long.
	cmd.WaitDelay = grace
	// Should stockctl die without stopping CMD (SIGKILL, a crash), the
	// watcher stops CMD and its group before the lease can lapse. It runs,
	// and knows CMD's group (its own, which CMD joins), before CMD starts:
	// no kill of stockctl, however early, leaves CMD unwatched.
	lw, err := startLockWatcher(grace, ownGroup)
	if err != nil {
		fmt.Fprintf(c.App.ErrWriter, "stockctl: warning: %v: if stockctl is killed, what %q started may outlive the lock\n", err, argv[0])
	}
	if lw != nil {
		defer lw.release()
		if ownGroup {
			lw.joinGroup(cmd)
		}
	}
	// The first kill-by time, from a renewal made now: it also checks that
	// the lease still runs before CMD does.
	fctx, cancelFirst := context.WithTimeout(ctx, ttl)
	killBy, err := renewForKillBy(fctx, cn.client, l.Lease())
	cancelFirst()
	if err != nil {
		unlock(l)
		return 0, ucli.Exit(fmt.Errorf("failed to renew the lease of lock %s before running %q: %w", l.Name(), argv[0], err), lockStatusOnLoss)
	}
	if lw != nil {
		lw.setKillBy(killBy)
	}
	exited, err := startChild(cmd)
	if err != nil {
		unlock(l)
		return 0, ucli.Exit(fmt.Errorf("failed to start %q under lock %s: %w", argv[0], l.Name(), err), ExitFailure)
	}
	pgid := 0 // CMD's process group when it has its own
	switch {
	case ownGroup && lw != nil:
		pgid = lw.pgid()
	case ownGroup:
		pgid = cmd.Process.Pid
	case lw != nil:
		lw.setTarget(cmd.Process.Pid)
	}
	rctx, stopRenew := context.WithCancel(context.Background())
	defer stopRenew()
	if lw != nil {
		renewing := make(chan struct{})
		go func() {
			defer close(renewing)
			keepKillBy(rctx, cn.client, l.Lease(), ttl, lw.setKillBy)
		}()
		defer func() { stopRenew(); <-renewing }()
	}

	wctx, stopWatch := context.WithCancel(context.Background())
	defer stopWatch()
	lost := watchLoss(wctx, cn.client, l)

	select {
	case err := <-exited:
		stopWatch()
		code := exitStatus(cmd.ProcessState)
		if uerr := unlock(l); uerr != nil && code == 0 {
			// CMD finished, but not all of its run was under the lock.
			return 0, ucli.Exit(fmt.Errorf("command finished, but lock %s was lost before it did: %w", l.Name(), uerr), lockStatusOnLoss)
		}
		if code < 0 {
			return 0, ucli.Exit(fmt.Errorf("failed to wait for %q: %w", argv[0], err), ExitFailure)
		}
		return code, nil
	case why := <-lost:
		how := stopChild(cmd, pgid, grace, exited)
		return 0, ucli.Exit(fmt.Errorf("lock %s lost while %q ran (%v); stopped it with %s", l.Name(), argv[0], why, how), lockStatusOnLoss)
	case <-ctx.Done():
		// Interrupted: pass it on, and end like CMD does.
		how := stopChild(cmd, pgid, grace, exited)
		unlock(l)
		fmt.Fprintf(c.App.ErrWriter, "stockctl: %v: stopped %q with %s\n", context.Cause(ctx), argv[0], how)
		<-exited
		return max(exitStatus(cmd.ProcessState), 0), nil
	}
}

// startChild starts cmd and returns the channel of its Wait. The start and
// the wait run on one OS thread, locked to them until cmd exits: Linux sends
// the parent-death signal when the thread that started the child ends, not
// the process, and Go may end a thread it no longer needs.
func startChild(cmd *exec.Cmd) (chan error, error) {
	exited := make(chan error, 1)
	started := make(chan error)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		err := cmd.Start()
		started <- err
		if err == nil {
			exited <- cmd.Wait()
		}
	}()
	return exited, <-started
}

// childEnviron is stockctl's environment for CMD, without STOCKCTL_USER:
// it carries the etcd password, which CMD has no business with.
func childEnviron(env []string) []string {
	out := make([]string, 0, len(env))
	for _, kv := range env {
		if !strings.HasPrefix(kv, envUser+"=") {
			out = append(out, kv)
		}
	}
	return out
}

// stopChild sends SIGTERM, then SIGKILL after grace, and waits for the
// child to exit; it leaves the exit status in exited for the caller and
// says which signal it took.
func stopChild(cmd *exec.Cmd, pgid int, grace time.Duration, exited chan error) string {
	signalChild(cmd, pgid, syscall.SIGTERM)
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case err := <-exited:
		exited <- err
		return "SIGTERM"
	case <-t.C:
		signalChild(cmd, pgid, syscall.SIGKILL)
		exited <- <-exited
		return "SIGKILL after --grace " + grace.String()
	}
}

// unlock releases l with a fresh, bounded ctx.
func unlock(l *coordinator.Lock) error {
	ctx, cancel := context.WithTimeout(context.Background(), unlockTimeout)
	defer cancel()
	return l.Unlock(ctx)
}

// exitStatus is a finished child's exit status in shell terms: its code,
// or 128+N when signal N killed it; -1 if it is unknown. It holds even when
// Wait reported an error only because CMD's children kept its output open
// (exec.ErrWaitDelay).
func exitStatus(ps *os.ProcessState) int {
	if ps == nil {
		return -1
	}
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return ps.ExitCode()
}

// watchLoss reports (once) when l is lost: when its hold ends (the
// coordinator noticed its session ended) or, sooner, when its etcd key is
// deleted (the lease was revoked or expired, or someone deleted the key).
// It stops when ctx ends.
func watchLoss(ctx context.Context, client *clientv3.Client, l *coordinator.Lock) <-chan error {
	lost := make(chan error, 1)
	go func() {
		rev := l.Revision() // the key's create revision: nothing before it matters
		for ctx.Err() == nil {
			wctx, cancel := context.WithCancel(ctx)
			wch := client.Watch(clientv3.WithRequireLeader(wctx), l.Key(), clientv3.WithRev(rev), clientv3.WithFilterPut())
			why := func() error {
				for {
					select {
					case <-l.Done():
						return l.Err()
					case wr, ok := <-wch:
						if !ok {
							return nil
						}
						if wr.CompactRevision != 0 {
							// History before rev is gone: look at the key itself.
							resp, err := client.Get(ctx, l.Key())
							if err != nil {
								return nil
							}
							if len(resp.Kvs) == 0 || resp.Kvs[0].CreateRevision != l.Revision() {
								return fmt.Errorf("lock key %s is gone", l.Key())
							}
							rev = resp.Header.Revision + 1
							return nil
						}
						for _, ev := range wr.Events {
							if ev.Type == clientv3.EventTypeDelete {
								return fmt.Errorf("lock key %s was deleted at revision %d (lease revoked or expired?)", l.Key(), ev.Kv.ModRevision)
							}
						}
					}
				}
			}()
			cancel()
			if why != nil {
				lost <- why
				return
			}
			// The watch broke (e.g. no leader): rewatch after a pause.
			select {
			case <-ctx.Done():
			case <-l.Done():
				lost <- l.Err()
				return
			case <-time.After(100 * time.Millisecond):
			}
		}
	}()
	return lost
}

// isTerminal reports whether r is a terminal (a character device other
// than /dev/null).
func isTerminal(r any) bool {
	f, ok := r.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	if err != nil || fi.Mode()&os.ModeCharDevice == 0 {
		return false
	}
	if null, err := os.Stat(os.DevNull); err == nil && os.SameFile(fi, null) {
		return false
	}
	return true
}
