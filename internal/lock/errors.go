package lock

import (
	"errors"
	"fmt"
)

// Errors. The coordinator package re-exports each under its own name
// (coordinator.ErrClosed, ErrSessionLost, ErrLockLost, ErrNotHeld,
// ErrLocked); the texts are the coordinator's.
var (
	// ErrClosed is returned by every call after Close, and is the cause of
	// holds that were held when Close was called.
	ErrClosed = errors.New("coordinator: closed")
	// ErrSessionLost means the engine's etcd session (its lease) ended while
	// the call waited for a lock. The next call starts a new session.
	ErrSessionLost = errors.New("coordinator: etcd session lost")
	// ErrLost means a held lock's session ended, or its key was deleted:
	// another process may hold the lock now, and fenced writes made with it
	// fail.
	ErrLost = errors.New("coordinator: lock lost")
	// ErrNotHeld is returned by a release of a hold that was already
	// released.
	ErrNotHeld = errors.New("coordinator: lock not held by this handle")
	// ErrLocked is returned when the lock stayed held by someone else for the
	// whole wait budget. No key is left behind.
	ErrLocked = errors.New("coordinator: lock is held by someone else")
)

// ErrModeHeld is returned when a caller holding one mode of a read-write
// lock (its ctx carries the hold) asks for the other: the acquisition would
// wait for the caller itself. Release first; there is no upgrade or
// downgrade in place.
var ErrModeHeld = errors.New("coordinator: this caller already holds the lock in the other mode")

// ErrLimitMismatch is the sentinel of a *LimitError.
var ErrLimitMismatch = errors.New("coordinator: semaphore limit mismatch")

// LimitError is the error of a semaphore acquisition whose limit differs
// from the limit the semaphore's current holders and waiters use (stored in
// their keys). Nothing was written. A semaphore's limit can change only
// once nobody holds or waits for it.
type LimitError struct {
	Name       string // the semaphore's name (set by the coordinator)
	Want, Have int
}

func (e *LimitError) Error() string {
	return fmt.Sprintf("%v: asked with limit %d, held with limit %d", ErrLimitMismatch, e.Want, e.Have)
}

// Unwrap makes errors.Is(err, ErrLimitMismatch) hold.
func (e *LimitError) Unwrap() error { return ErrLimitMismatch }
