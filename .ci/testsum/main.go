// Command testsum reads `go test -json` on stdin, prints what plain
// `go test` prints (one line per package, and the output of every failed
// test in full), then a summary of skipped tests with their reasons and of
// failures. It exits 1 when any test or package failed (or the stream held
// no package result), so a summary never hides a failure.
//
// Used by .ci/run: go test -json ./... | go run ./.ci/testsum
// (.ci is outside ./..., so this is not a package of the module.)
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
)

type event struct {
	Action  string
	Package string
	Test    string
	Output  string
	Elapsed float64
}

type key struct{ pkg, test string }

func main() {
	os.Exit(run(os.Stdin, os.Stdout))
}

func run(in io.Reader, out io.Writer) int {
	outputs := map[key][]string{}
	var skips, fails []key
	pkgs, failedPkgs := 0, 0
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		line := sc.Bytes()
		var e event
		if err := json.Unmarshal(line, &e); err != nil || e.Action == "" {
			// Not test2json (a build error printed by go itself): pass it on.
			fmt.Fprintf(out, "%s\n", line)
			continue
		}
		k := key{e.Package, e.Test}
		switch e.Action {
		case "output":
			outputs[k] = append(outputs[k], e.Output)
		case "skip":
			if e.Test != "" {
				skips = append(skips, k)
			} else {
				pkgs++
				fmt.Fprintf(out, "?   \t%s\t[no test files]\n", e.Package)
			}
		case "fail":
			if e.Test != "" {
				fails = append(fails, k)
				fmt.Fprint(out, strings.Join(outputs[k], ""))
				continue
			}
			pkgs++
			failedPkgs++
			// The package's own output: build failures, panics, FAIL line.
			fmt.Fprint(out, strings.Join(outputs[k], ""))
		case "pass":
			if e.Test == "" {
				pkgs++
				fmt.Fprintf(out, "ok  \t%s\t%.3fs\n", e.Package, e.Elapsed)
			}
		}
	}
	if err := sc.Err(); err != nil {
		fmt.Fprintf(out, "testsum: reading the test stream: %v\n", err)
		return 1
	}
	fmt.Fprintf(out, "\n== skipped tests: %d\n", len(skips))
	sort.Slice(skips, func(i, j int) bool {
		return skips[i].pkg+" "+skips[i].test < skips[j].pkg+" "+skips[j].test
	})
	for _, k := range skips {
		fmt.Fprintf(out, "SKIP %s %s: %s\n", short(k.pkg), k.test, reason(outputs[k]))
	}
	fmt.Fprintf(out, "== %d packages, %d failed; %d tests failed\n", pkgs, failedPkgs, len(fails))
	for _, k := range fails {
		fmt.Fprintf(out, "FAIL %s %s\n", short(k.pkg), k.test)
	}
	if pkgs == 0 || failedPkgs > 0 || len(fails) > 0 {
		return 1
	}
	return 0
}

// reason is a skipped test's message: its log lines, without the
// "=== RUN" and "--- SKIP" framing, on one line.
func reason(lines []string) string {
	var r []string
	for _, l := range lines {
		t := strings.TrimSpace(l)
		if t == "" || strings.HasPrefix(t, "=== ") || strings.HasPrefix(t, "--- ") {
			continue
		}
		r = append(r, t)
	}
	if len(r) == 0 {
		return "(no reason given)"
	}
	return strings.Join(r, " ")
}

func short(pkg string) string {
	return strings.TrimPrefix(pkg, "github.com/rdmakit/rdmakit/")
}
