package keys

import (
	"fmt"
	"strconv"
	"strings"
)

// Named locks, read-write locks and semaphores.
//
//	P locks/<name>/<lease>            exclusive holders and waiters of lock <name>: one key per
//	                                  session (concurrency.Mutex's layout, so that a stock etcd
//	                                  Mutex on the prefix interoperates)
//	P locks/<name>/s/<lease>-<n>      shared holders and waiters of the same lock (its read side):
//	                                  one key per acquisition in etcd, n counting a session's keys
//	P sems/<name>/<lease>-<n>         holders and waiters of semaphore <name>; every key's value is
//	                                  the semaphore's limit, in decimal
//	P delays/<lock path>/<key suffix> lock-delay records: a holder acquired under a lock-delay
//	                                  writes one (no lease) and deletes it with its key when it
//	                                  releases; a record whose key is gone marks a holder lost
//	                                  without releasing
//
// Leases are hexadecimal, n decimal. Exclusive keys sort before the shared
// subtree ("s/"), because hexadecimal digits sort before 's': the range
// [Lock(name), ExclusiveEnd(Lock(name))) holds exactly the exclusive keys.

// SharedDir is the subdirectory of a named lock's prefix that holds its
// shared (read) keys.
const SharedDir = "s/"

// LocksPrefix is the prefix of every named lock's keys.
func (s Space) LocksPrefix() string { return s.prefix + "locks/" }

// SharedLock is the prefix of the shared keys of the named lock.
func (s Space) SharedLock(name string) string { return s.Lock(name) + SharedDir }

// SemaphoresPrefix is the prefix of every semaphore's keys.
func (s Space) SemaphoresPrefix() string { return s.prefix + "sems/" }

// Semaphore is the key prefix of the named semaphore.
func (s Space) Semaphore(name string) string { return s.SemaphoresPrefix() + name + "/" }

// Delay is the prefix of the lock-delay records of the lock or semaphore
// whose keys live under lockPrefix (Lock(name) or Semaphore(name)). The
// record of a holder key K is Delay(lockPrefix) + (K without lockPrefix).
func (s Space) Delay(lockPrefix string) string {
	return s.prefix + "delays/" + strings.TrimPrefix(lockPrefix, s.prefix)
}

// ExclusiveEnd is the exclusive end of the range, from lockPrefix (a
// Lock(name)), that holds the lock's exclusive keys and not its shared ones.
func ExclusiveEnd(lockPrefix string) string { return lockPrefix + "s" }

// ExclusiveWaiter is the exclusive waiter key of the session with lease
// under lockPrefix (one per session and lock).
func ExclusiveWaiter(lockPrefix string, lease int64) string {
	return lockPrefix + strconv.FormatInt(lease, 16)
}

// SeqWaiter is the waiter key number n of the session with lease under
// pfx: the shared keys of a lock (pfx = SharedLock(name)) and a
// semaphore's keys (pfx = Semaphore(name)), of which a session may have
// several.
func SeqWaiter(pfx string, lease, n int64) string {
	return pfx + strconv.FormatInt(lease, 16) + "-" + strconv.FormatInt(n, 10)
}

// NamedKind says what a named lock key is.
type NamedKind int

// Kinds of named lock keys.
const (
	NamedExclusive NamedKind = iota + 1
	NamedShared
	NamedSemaphore
)

func (k NamedKind) String() string {
	switch k {
	case NamedExclusive:
		return "exclusive"
	case NamedShared:
		return "shared"
	case NamedSemaphore:
		return "semaphore"
	}
	return "unknown"
}

// NamedKey is a parsed key of a named lock or semaphore.
type NamedKey struct {
	Name  string
	Kind  NamedKind
	Lease int64
	Seq   int64 // -1 for exclusive keys
}

// ParseNamed parses a key under LocksPrefix or SemaphoresPrefix.
func (s Space) ParseNamed(key string) (NamedKey, error) {
	var k NamedKey
	rest, ok := strings.CutPrefix(key, s.LocksPrefix())
	if ok {
		k.Kind = NamedExclusive
	} else if rest, ok = strings.CutPrefix(key, s.SemaphoresPrefix()); ok {
		k.Kind = NamedSemaphore
	} else {
		return NamedKey{}, fmt.Errorf("keys: %q is not a named lock key", key)
	}
	name, tail, ok := strings.Cut(rest, "/")
	if !ok || name == "" {
		return NamedKey{}, fmt.Errorf("keys: %q has no lock name", key)
	}
	k.Name = name
	if t, ok := strings.CutPrefix(tail, SharedDir); ok && k.Kind == NamedExclusive {
		k.Kind, tail = NamedShared, t
	}
	k.Seq = -1
	lease := tail
	if k.Kind != NamedExclusive {
		l, n, ok := strings.Cut(tail, "-")
		if !ok {
			return NamedKey{}, fmt.Errorf("keys: %q: want <lease>-<n>", key)
		}
		seq, err := strconv.ParseInt(n, 10, 64)
		if err != nil || seq < 0 || strconv.FormatInt(seq, 10) != n {
			return NamedKey{}, fmt.Errorf("keys: %q: %q is not a decimal sequence number", key, n)
		}
		lease, k.Seq = l, seq
	}
	id, err := strconv.ParseInt(lease, 16, 64)
	if err != nil || id <= 0 || strconv.FormatInt(id, 16) != lease {
		return NamedKey{}, fmt.Errorf("keys: %q: lease %q is not hexadecimal", key, lease)
	}
	k.Lease = id
	return k, nil
}
