package cli

import (
	ucli "github.com/urfave/cli/v2"

	"github.com/stockctl/stockctl/coordinator"
)

// identityFlag is --identity: the name this process shows other processes,
// as the holder of the locks it takes and as the rebalancer. It is a global
// flag, and serve's and rebalance's own too (where it was first), so that
// `stockctl serve --identity shop-1` keeps working.
func identityFlag() ucli.Flag {
	return &ucli.StringFlag{Name: "identity", EnvVars: []string{"STOCKCTL_IDENTITY"},
		Usage: "name of this process where others see it: the holder of its locks (status --watch, lock listings) " +
			"and the rebalancer's leadership record (default: host/pid)"}
}

// readIdentity is --identity as given to the command or, before it, to
// stockctl (a command's own flag would otherwise hide the global one), or
// the coordinator's default, host/pid.
func readIdentity(c *ucli.Context) (string, error) {
	id := ""
	for _, l := range c.Lineage() {
		if l.IsSet("identity") {
			id = l.String("identity")
			break
		}
	}
	if id == "" {
		return coordinator.DefaultIdentity(), nil
	}
	if err := coordinator.ValidateIdentity(id); err != nil {
		return "", usageError("invalid --identity: %v", err)
	}
	return id, nil
}
