package ring

import "github.com/rdmakit/rdmakit/internal/sys"

// The race detector does not see the atomics on ring words (they live in
// mmap'd memory it does not shadow), so it would miss the happens-before
// edge from a producer's push to the consumer's pop and report races on
// heap memory the two hand over (registered caller buffers). The hand-off
// is annotated through internal/sys (one process-wide sync variable in
// race builds, nothing otherwise).
func raceRelease() { sys.RaceRelease() }
func raceAcquire() { sys.RaceAcquire() }
