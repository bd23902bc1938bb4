//go:build !linux

package sys

// BindProcess would restrict this process to one CPU; only Linux has it
// here.
func BindProcess(n int) (int, error) { return -1, notSupported("sched_setaffinity") }
