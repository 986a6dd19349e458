package lock

import "errors"

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
