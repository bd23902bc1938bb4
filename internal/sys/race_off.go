//go:build !race

package sys

// RaceRelease annotates a hand-off for the race detector; a no-op without
// -race (see race_unsafe.go).
func RaceRelease() {}

// RaceAcquire annotates a hand-off for the race detector; a no-op without
// -race (see race_unsafe.go).
func RaceAcquire() {}

// raceWrote is a no-op without -race (see race_unsafe.go).
func raceWrote(b []byte) {}
