//go:build race

package ring

import (
	"runtime"
	"unsafe"
)

// The race detector does not see the atomics on ring words (they live in
// mmap'd memory it does not shadow), so it would miss the happens-before
// edge from a producer's push to the consumer's pop and report races on
// heap memory the two hand over (registered caller buffers). One
// process-wide sync variable stands in for every ring in race builds.
var raceSync byte

func raceRelease() { runtime.RaceReleaseMerge(unsafe.Pointer(&raceSync)) }
func raceAcquire() { runtime.RaceAcquire(unsafe.Pointer(&raceSync)) }
