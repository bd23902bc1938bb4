//go:build !amd64 || race

package sys

import "testing"

// copyPaths: Copy is copy here (cpu_other.go), one path.
func copyPaths() []copyPath {
	return []copyPath{{"copy", func(*testing.T) string { return "" }}}
}
