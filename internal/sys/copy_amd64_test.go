//go:build amd64 && !race

package sys

import (
	"testing"

	"golang.org/x/sys/cpu"
)

// copyPaths returns the ways Copy can be made to go on this host: with
// AVX-512 (where the CPU and OS have it) and REP MOVSB as detected, with
// AVX-512 off (the fallbacks: copy up to MovsbMin, REP MOVSB from there),
// and with both off (copy throughout). set switches Copy to the path for
// the rest of t, restoring the detected choice with t.Cleanup; it returns
// why the path cannot run here ("" if it can).
func copyPaths() []copyPath {
	return []copyPath{
		{"avx512", func(t *testing.T) string {
			if !cpu.X86.HasAVX512F {
				return "CPU or OS without AVX-512F"
			}
			setCopyVars(t, true, useMovsb)
			return ""
		}},
		{"fallback", func(t *testing.T) string { setCopyVars(t, false, useMovsb); return "" }},
		{"copy", func(t *testing.T) string { setCopyVars(t, false, false); return "" }},
	}
}

func setCopyVars(t *testing.T, avx512, movsb bool) {
	a, m := useAVX512, useMovsb
	t.Cleanup(func() { useAVX512, useMovsb = a, m })
	useAVX512, useMovsb = avx512, movsb
}
