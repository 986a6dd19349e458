//go:build unix && !linux

package cli

import "time"

// monoNow is the wall clock here, as nanoseconds since 1970: it is the
// same in every process of the machine, and steps only when the clock is
// set.
func monoNow() time.Duration { return time.Duration(time.Now().UnixNano()) }

// raisePriority does nothing here.
func raisePriority() {}
