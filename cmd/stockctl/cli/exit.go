package cli

import (
	"context"
	"errors"
	"fmt"
	"io"

	ucli "github.com/urfave/cli/v2"

	"github.com/stockctl/stockctl/cmd/stockctl/sale"
	"github.com/stockctl/stockctl/coordinator"
)

// Exit codes of stockctl. They are part of its contract with scripts.
const (
	// ExitOK: the command did what was asked.
	ExitOK = 0
	// ExitFailure: anything else went wrong: etcd unreachable, a lock lost,
	// an audit that does not balance, a demo that oversold.
	ExitFailure = 1
	// ExitUsage: invalid input or usage. Nothing was changed.
	ExitUsage = 2
	// ExitInsufficientStock: an allocation was refused for lack of stock.
	ExitInsufficientStock = 3
	// ExitNotFound: the SKU or order does not exist.
	ExitNotFound = 4
	// ExitConflict: the SKU already exists, or the order ID was used with
	// other values (or a reservation cannot take the step asked: confirm of
	// a cancelled one, cancel of a confirmed one).
	ExitConflict = 5
	// ExitLimitExceeded: an allocation or reservation was refused because
	// it would take its buyer past the SKU's per-user limit. Nothing was
	// taken.
	ExitLimitExceeded = 6
	// ExitExpired: the reservation expired (its units went back): confirm,
	// cancel or release of it, or a retried reserve that finds it expired.
	ExitExpired = 7
	// ExitPruned: the order was archived by prune, which keeps its ID
	// (--keep-ids): a retried allocate or reserve of it is refused, never
	// applied twice, and so are its release, cancel and confirm.
	ExitPruned = 9
)

// codeOf maps a library error to the exit code scripts see.
func codeOf(err error) int {
	switch {
	case err == nil:
		return ExitOK
	case errors.Is(err, coordinator.ErrInvalidArgument), errors.Is(err, sale.ErrInvalidConfig):
		return ExitUsage
	case errors.Is(err, coordinator.ErrInsufficientStock):
		return ExitInsufficientStock
	case errors.Is(err, coordinator.ErrOrderPruned): // before ErrOrderNotFound, which it also matches
		return ExitPruned
	case errors.Is(err, coordinator.ErrUnknownSKU), errors.Is(err, coordinator.ErrOrderNotFound):
		return ExitNotFound
	case errors.Is(err, coordinator.ErrConflict):
		return ExitConflict
	case errors.Is(err, coordinator.ErrLimitExceeded):
		return ExitLimitExceeded
	case errors.Is(err, coordinator.ErrExpired):
		return ExitExpired
	}
	return ExitFailure
}

// failed is the error of a command that could not do what: "failed to
// <what>: <err>", with the exit code err calls for. ctx is the command's:
// when it ended, the message says why (--timeout, or an interrupt) rather
// than leaving the reader with a bare "context deadline exceeded".
func failed(ctx context.Context, what string, err error) error {
	if ctx != nil && ctx.Err() != nil {
		if cause := context.Cause(ctx); cause != nil && !errors.Is(err, cause) {
			err = fmt.Errorf("%w (%v)", err, cause)
		}
	}
	var low *coordinator.SpaceLowError
	switch {
	case errors.As(err, &low):
		err = fmt.Errorf("%w: %s", err, spaceLowHint)
	case errors.Is(err, coordinator.ErrNoSpace):
		err = fmt.Errorf("%w: %s", err, noSpaceHint)
	}
	if what == "" {
		return ucli.Exit(fmt.Errorf("failed to %w", err), codeOf(err))
	}
	return ucli.Exit(fmt.Errorf("failed to %s: %w", what, err), codeOf(err))
}

// opFailed is the error of a command whose library call failed. The
// library's errors already say what was done to what ("allocate iphone
// order "o-1": insufficient stock: want 5, have 3 at revision 9"), so the
// message is "failed to " and that, said once.
func opFailed(ctx context.Context, err error) error { return failed(ctx, "", err) }

// noSpaceHint is what an operator does when etcd refuses writes because its
// database reached its quota (docs/operations.md).
const noSpaceHint = "etcd's database is full (alarm NOSPACE: it reached its --quota-backend-bytes) and etcd refuses every write " +
	"until space is reclaimed; reads still work. Run `stockctl reclaim` (compact, defragment, disarm the alarm), " +
	"then `stockctl prune SKU --older-than D` to archive old orders (while etcd is nearly full, prune may stop " +
	"part way: reclaim and prune again), and retry the orders that failed under their IDs; see docs/operations.md"

// spaceLowHint is what an operator does when the space guard refuses new
// orders (--space-guard): etcd still takes every other write.
const spaceLowHint = "etcd still takes every other write (releases, confirms, prune); run `stockctl prune SKU --older-than D` " +
	"to archive old orders (then `stockctl reclaim` to compact and defragment), and retry the refused orders under their IDs; " +
	"see docs/operations.md"

// usageError is invalid input or usage: exit 2, with a message naming what
// was wrong.
func usageError(format string, args ...any) error {
	return ucli.Exit(fmt.Errorf(format, args...), ExitUsage)
}

// ExitCode is the process exit status for the error a command returned.
func ExitCode(err error) int {
	if err == nil {
		return ExitOK
	}
	var ec ucli.ExitCoder
	if errors.As(err, &ec) {
		return ec.ExitCode()
	}
	return ExitFailure
}

// reportError prints err, if it has anything to say, as "stockctl: <err>".
func reportError(w io.Writer, err error) {
	if err == nil {
		return
	}
	if msg := err.Error(); msg != "" {
		fmt.Fprintf(w, "stockctl: %s\n", msg)
	}
}
