package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"unicode/utf8"

	ucli "github.com/urfave/cli/v2"
)

// New builds the stockctl application. Run it with Run (or Main), which
// also accepts a command's flags after its arguments.
func New() *ucli.App {
	app := &ucli.App{
		Name:  "stockctl",
		Usage: "distributed locks and segmented stock on etcd",
		Description: "Without --endpoints every command runs against an embedded etcd in --data-dir, for the\n" +
			"command's duration; `stockctl serve` keeps one running for several processes to share.\n" +
			"Global flags go before the command: stockctl -o json status iphone.",
		Flags:        append(globalFlags(), helpFlag()),
		Commands:     commands(),
		HideVersion:  true,
		HideHelp:     true, // see helpFlag
		Writer:       os.Stdout,
		ErrWriter:    os.Stderr,
		OnUsageError: onUsageError,
		Action:       rootAction,
	}
	for _, cmd := range app.Commands {
		cmd.OnUsageError = onUsageError
		// No "help" subcommand, which would shadow a SKU or lock named
		// "help"; --help stays.
		cmd.HideHelp = true
		cmd.Flags = append(cmd.Flags, helpFlag())
	}
	return app
}

// helpFlag is a --help flag of this app's own. urfave/cli's built-in one
// is a package-level value it writes to while parsing, so two apps running
// at once in one process (as in tests) would race on it. urfave/cli still
// recognises ours by its names and shows the help.
func helpFlag() ucli.Flag {
	return &ucli.BoolFlag{Name: "help", Aliases: []string{"h"}, Usage: "show help"}
}

func commands() []*ucli.Command {
	return []*ucli.Command{
		initCommand(),
		allocateCommand(),
		releaseCommand(),
		reserveCommand(),
		confirmCommand(),
		cancelCommand(),
		restockCommand(),
		statusCommand(),
		auditCommand(),
		listCommand(),
		policyCommand(),
		pruneCommand(),
		deleteCommand(),
		removeClusterCommand(),
		reclaimCommand(),
		ordersCommand(),
		rebalanceCommand(),
		lockCommand(),
		semaphoreCommand(),
		locksCommand(),
		serveCommand(),
		demoCommand(),
		benchCommand(),
	}
}

// Main runs stockctl on args (os.Args) and returns the exit status; or,
// run again by `stockctl lock` or `semaphore` as its lock watcher, that.
func Main(args []string) int {
	if isLockWatcher(args) {
		return runLockWatcher(args, os.Stdin, os.Stdout)
	}
	return Run(context.Background(), New(), args)
}

// Run runs app on args (the program name first) and returns the exit
// status. Errors are printed on app.ErrWriter; nothing calls os.Exit.
func Run(ctx context.Context, app *ucli.App, args []string) int {
	app.ExitErrHandler = func(*ucli.Context, error) {} // Run reports and exits, not urfave/cli
	err := app.RunContext(ctx, permuteArgs(app, args))
	reportError(app.ErrWriter, err)
	return ExitCode(err)
}

// rootAction runs when no command was given, or an unknown one.
func rootAction(c *ucli.Context) error {
	if c.Args().First() == "help" {
		if c.NArg() > 1 {
			if err := ucli.ShowCommandHelp(c, c.Args().Get(1)); err != nil {
				return usageError("unknown command %q; see stockctl --help", c.Args().Get(1))
			}
			return nil
		}
		return ucli.ShowAppHelp(c)
	}
	if c.Args().Present() {
		return usageError("unknown command %q; see stockctl --help", c.Args().First())
	}
	ucli.HelpPrinter(c.App.ErrWriter, ucli.AppHelpTemplate, c.App)
	return usageError("no command given")
}

// onUsageError turns urfave/cli's flag parsing errors into exit 2, without
// printing the whole help on stdout (which scripts parse).
func onUsageError(c *ucli.Context, err error, isSubcommand bool) error {
	msg := err.Error()
	if name, ok := strings.CutPrefix(msg, "flag provided but not defined: "); ok && isSubcommand {
		name = strings.TrimLeft(name, "-")
		for _, f := range c.App.Flags {
			for _, n := range f.Names() {
				if n == name {
					return usageError("%s: --%s is a global flag: put it before the command (stockctl --%s ... %s ...)", msg, name, name, c.Command.Name)
				}
			}
		}
	}
	if isSubcommand && c.Command != nil && (c.Command.Name == "lock" || c.Command.Name == "semaphore") && strings.HasPrefix(msg, "flag provided but not defined") {
		return usageError("%s: put the command to run after -- (stockctl %s NAME -- CMD ARGS...)", msg, c.Command.Name)
	}
	where := "stockctl"
	if isSubcommand && c.Command != nil {
		where = "stockctl " + c.Command.Name
	}
	return usageError("%s (see %s --help)", msg, where)
}

// oneArg returns a command's single positional argument, validated by
// check, or a usage error naming what is missing or extra.
func oneArg(c *ucli.Context, what string, check func(string) error) (string, error) {
	switch c.NArg() {
	case 0:
		return "", usageError("missing %s argument (usage: stockctl %s %s)", what, c.Command.Name, c.Command.ArgsUsage)
	case 1:
	default:
		return "", usageError("too many arguments %q: %s takes one %s (usage: stockctl %s %s)",
			c.Args().Slice()[1:], c.Command.Name, what, c.Command.Name, c.Command.ArgsUsage)
	}
	v := c.Args().First()
	if err := asciiOnly(what, v); err != nil {
		return "", err
	}
	if check != nil {
		if err := check(v); err != nil {
			return "", usageError("%v", err)
		}
	}
	return v, nil
}

// requireFlags is a usage error naming the first of names not given.
func requireFlags(c *ucli.Context, names ...string) error {
	for _, n := range names {
		if !c.IsSet(n) {
			return usageError("missing --%s (usage: stockctl %s %s)", n, c.Command.Name, c.Command.ArgsUsage)
		}
	}
	return nil
}

// showLine is show for commands that stream further lines: with -o json
// the result is one compact line.
func showLine(c *ucli.Context, g *globals, v tabular) error {
	if g.output != outputJSON {
		return show(c, g, v)
	}
	b, err := json.Marshal(v)
	if err == nil {
		_, err = fmt.Fprintf(c.App.Writer, "%s\n", b)
	}
	if err != nil {
		return ucli.Exit(fmt.Errorf("failed to write the output: %w", err), ExitFailure)
	}
	return nil
}

// show renders a result on the command's writer.
func show(c *ucli.Context, g *globals, v tabular) error {
	if err := render(c.App.Writer, g.output, v); err != nil {
		return ucli.Exit(fmt.Errorf("failed to write the output: %w", err), ExitFailure)
	}
	return nil
}

// asciiOnly refuses a non-ASCII name (a SKU, an order or buyer ID, a lock
// name: all ASCII) quoting it and its character as UTF-8; the library's
// own check names a byte, which prints as mojibake ('Ã' for the first
// byte of 'é').
func asciiOnly(what, v string) error {
	for i, r := range v {
		if r < utf8.RuneSelf {
			continue
		}
		if _, size := utf8.DecodeRuneInString(v[i:]); r == utf8.RuneError && size <= 1 {
			return usageError("invalid %s %q: byte %d (%#02x) is not valid UTF-8, and only ASCII is allowed", what, v, i, v[i])
		}
		return usageError("invalid %s %q: the non-ASCII character %q (U+%04X) at byte %d: only ASCII is allowed", what, v, r, r, i)
	}
	return nil
}
