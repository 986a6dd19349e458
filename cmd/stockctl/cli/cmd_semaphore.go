package cli

import (
	"time"

	ucli "github.com/urfave/cli/v2"

	"github.com/stockctl/stockctl/coordinator"
)

func semaphoreCommand() *ucli.Command {
	return &ucli.Command{
		Name:  "semaphore",
		Usage: "run a command while holding one of the --limit permits of a named semaphore",
		Description: "Waits for a permit (up to --timeout; 0: no limit): at most --limit holders, across every\n" +
			"process, hold the semaphore at once. Then runs CMD as `stockctl lock` does: with " + envLockName + ",\n" +
			envLockKey + ", " + envLockRevision + " and " + envFencingToken + " in its environment, exiting with CMD's status,\n" +
			"and stopping CMD (SIGTERM, SIGKILL after --grace; exit 1) if the permit is lost. The limit is\n" +
			"stored with the semaphore while anyone holds or waits: another --limit then exits 5.\n" +
			"Semaphores are named apart from locks.",
		ArgsUsage: "NAME --limit N [--ttl D] [--grace D] -- CMD [ARGS...]",
		Flags: []ucli.Flag{
			&ucli.IntFlag{Name: "limit", EnvVars: []string{"STOCKCTL_SEMAPHORE_LIMIT"},
				Usage: "the semaphore's number of permits, 1 to 1024 (required)"},
			&ucli.DurationFlag{Name: "ttl", Value: DefaultLockTTL, EnvVars: []string{"STOCKCTL_LOCK_TTL"},
				Usage: "lease TTL, whole seconds: how long the permit outlives a dead or cut-off stockctl"},
			&ucli.DurationFlag{Name: "grace", Value: DefaultLockGrace, EnvVars: []string{"STOCKCTL_LOCK_GRACE"},
				Usage: "after a lost permit, how long CMD gets between SIGTERM and SIGKILL"},
		},
		Action: semaphoreAction,
	}
}

func semaphoreAction(c *ucli.Context) error {
	g, err := readGlobals(c)
	if err != nil {
		return err
	}
	args := c.Args().Slice()
	if len(args) == 0 {
		return usageError("missing NAME argument (usage: stockctl semaphore %s)", c.Command.ArgsUsage)
	}
	name, argv := args[0], args[1:]
	if len(argv) > 0 && argv[0] == "--" {
		argv = argv[1:]
	}
	if err := coordinator.ValidateLockName(name); err != nil {
		return usageError("invalid semaphore NAME: %v", err)
	}
	if len(argv) == 0 {
		return usageError("missing the command to run (usage: stockctl semaphore %s)", c.Command.ArgsUsage)
	}
	limit, ttl, grace := c.Int("limit"), c.Duration("ttl"), c.Duration("grace")
	if limit < 1 || limit > coordinator.MaxSemaphoreLimit {
		return usageError("invalid --limit %d: want 1 to %d permits", limit, coordinator.MaxSemaphoreLimit)
	}
	if ttl < time.Second || ttl%time.Second != 0 {
		return usageError("invalid --ttl %v: must be a whole number of seconds, at least 1s", ttl)
	}
	if grace <= 0 {
		return usageError("invalid --grace %v: must be positive", grace)
	}

	ctx, stop := signalContext(c)
	defer stop()
	actx, cancel := g.commandContext(c) // connecting and waiting for the permit
	defer cancel()
	cn, err := connect(actx, c, g, coordinator.WithSessionTTL(ttl))
	if err != nil {
		return err
	}
	defer cn.Close()
	l, err := cn.coord.AcquirePermit(actx, name, limit)
	if err != nil {
		return failed(actx, "acquire a permit of semaphore "+name, err)
	}
	cancel()
	code, err := runLocked(ctx, c, cn, l, argv, grace)
	if err != nil {
		return err
	}
	if code != 0 {
		return ucli.Exit("", code) // CMD's status; CMD said what went wrong
	}
	return nil
}
