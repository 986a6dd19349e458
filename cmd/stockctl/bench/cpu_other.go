//go:build !linux

package bench

import "time"

// selfCPU and pidCPU are unknown here: the rows' CPU per order is 0.
func selfCPU() time.Duration   { return 0 }
func pidCPU(int) time.Duration { return 0 }
