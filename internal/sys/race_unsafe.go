//go:build race

package sys

import (
	"runtime"
	"unsafe"
)

// The race detector does not see the atomics on words in mmap'd memory (it
// does not shadow it), so it misses the happens-before edge of a hand-off
// through such a word and reports races on the heap memory handed over.
// One process-wide sync variable stands in for every such word in race
// builds; without -race the two functions are empty.
var raceSync byte

// RaceRelease tells the race detector that the memory this goroutine wrote
// is handed over (call it before publishing through a shared word).
func RaceRelease() { runtime.RaceReleaseMerge(unsafe.Pointer(&raceSync)) }

// RaceAcquire tells the race detector that this goroutine received memory
// handed over by a RaceRelease (call it after consuming a shared word).
func RaceAcquire() { runtime.RaceAcquire(unsafe.Pointer(&raceSync)) }

// raceWrote tells the race detector that the kernel wrote b (a read
// system call into it), as the standard library's Read does.
func raceWrote(b []byte) {
	if len(b) > 0 {
		runtime.RaceWriteRange(unsafe.Pointer(&b[0]), len(b))
	}
}
