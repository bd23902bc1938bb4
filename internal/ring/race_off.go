//go:build !race

package ring

func raceRelease() {}
func raceAcquire() {}
