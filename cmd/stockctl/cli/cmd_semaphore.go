package cli

import (
	"context"

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
			graceFlag("permit"),
		},
		Action: semaphoreAction,
	}
}

func semaphoreAction(c *ucli.Context) error {
	limit := c.Int("limit")
	check := func() error {
		if limit < 1 || limit > coordinator.MaxSemaphoreLimit {
			return usageError("invalid --limit %d: want 1 to %d permits", limit, coordinator.MaxSemaphoreLimit)
		}
		return nil
	}
	return runHeld(c, "semaphore", "acquire a permit of semaphore ", check, func(ctx context.Context, co *coordinator.Coordinator, name string) (*coordinator.Lock, error) {
		return co.AcquirePermit(ctx, name, limit)
	})
}
