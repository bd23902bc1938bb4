//go:build faultbugs

package tcp

// Fault cases that fail on transport bugs (knownBugs in fault_test.go),
// with their checks strict: go test -tags faultbugs -run TestFaultBugs.
// Goroutines: as in fault_test.go.

import "testing"

func TestFaultBugs(t *testing.T) {
	for _, c := range faultCases {
		for _, op := range opKinds {
			name := c.name + "/" + op.String()
			bug, ok := knownBugs[name]
			if !ok {
				continue
			}
			t.Run(name, func(t *testing.T) {
				t.Logf("bug: %s", bug)
				runFault(t, c, op, false)
			})
		}
	}
}
