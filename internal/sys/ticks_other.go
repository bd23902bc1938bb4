//go:build !amd64

package sys

import "time"

var ticksBase = time.Now()

// Ticks is the monotonic clock in nanoseconds on this architecture (see
// ticks_amd64.go).
func Ticks() int64 { return int64(time.Since(ticksBase)) }
