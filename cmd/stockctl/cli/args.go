package cli

import (
	"strings"

	ucli "github.com/urfave/cli/v2"
)

// permuteArgs moves a command's flags in front of its positional arguments,
// so that "stockctl allocate iphone --qty 2" works like "stockctl allocate
// --qty 2 iphone": urfave/cli (like Go's flag package) stops parsing flags
// at the first positional argument. Global flags must still come before the
// command. Everything from a "--" on is left alone and in place: for "lock
// NAME -- CMD ARGS…" it is the child's command line.
func permuteArgs(app *ucli.App, args []string) []string {
	if len(args) < 2 {
		return args
	}
	out := []string{args[0]}
	i := 1
	globalValues := valueFlags(app.Flags)
	for i < len(args) && isFlag(args[i]) {
		out = append(out, args[i])
		i++
		if takesValue(args[i-1], globalValues) && i < len(args) {
			out = append(out, args[i])
			i++
		}
	}
	if i >= len(args) {
		return out
	}
	cmd := app.Command(args[i])
	out = append(out, args[i])
	i++
	if cmd == nil || cmd.SkipFlagParsing {
		return append(out, args[i:]...)
	}
	values := valueFlags(cmd.Flags)
	var flags, positional []string
	for i < len(args) && args[i] != "--" {
		a := args[i]
		i++
		if !isFlag(a) {
			positional = append(positional, a)
			continue
		}
		flags = append(flags, a)
		if takesValue(a, values) && i < len(args) {
			flags = append(flags, args[i])
			i++
		}
	}
	out = append(out, flags...)
	out = append(out, positional...)
	return append(out, args[i:]...)
}

// isFlag reports whether a looks like a flag ("-x", "--x", "--x=v"), but not
// "-" or "--".
func isFlag(a string) bool {
	return len(a) > 1 && a[0] == '-' && a != "--"
}

// valueFlags returns the names of the flags that take a value (all but
// booleans).
func valueFlags(flags []ucli.Flag) map[string]bool {
	m := map[string]bool{}
	for _, f := range flags {
		_, isBool := f.(*ucli.BoolFlag)
		for _, n := range f.Names() {
			m[n] = !isBool
		}
	}
	return m
}

// takesValue reports whether flag a is followed by its value as the next
// argument: it takes one and does not carry it after "=".
func takesValue(a string, values map[string]bool) bool {
	name := strings.TrimLeft(a, "-")
	if strings.Contains(name, "=") {
		return false
	}
	return values[name]
}
