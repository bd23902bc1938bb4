//go:build !linux && !darwin && !dragonfly && !freebsd && !netbsd && !openbsd && !windows

package sys

// IsTerminal reports whether fd is a terminal. On this system it cannot
// tell, and says no.
func IsTerminal(fd uintptr) bool { return false }
