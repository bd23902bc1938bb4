package main

import (
	"os"
	"strings"
	"testing"
)

func TestCollPerf(t *testing.T) {
	for _, tc := range []struct {
		args  []string
		lines int
	}{
		{[]string{"all_reduce", "-b", "8", "-e", "1M", "-f", "32", "-n", "3", "--ranks", "2"}, 4},
		{[]string{"all_gather", "-b", "1K", "-e", "64K", "-f", "64", "-n", "2", "--ranks", "3", "--transport", "tcp"}, 2},
		{[]string{"reduce_scatter", "-b", "1K", "-e", "1K", "-n", "2", "-d", "half", "-o", "avg", "--ranks", "2"}, 1},
		{[]string{"broadcast", "-b", "1K", "-e", "1K", "-n", "2", "-r", "1", "--ranks", "2", "--algo", "tree"}, 1},
		{[]string{"reduce", "-b", "4K", "-e", "4K", "-n", "2", "-r", "-1", "-d", "int32", "-o", "max", "--ranks", "2"}, 2},
		{[]string{"alltoall", "-b", "64K", "-e", "64K", "-n", "2", "--ranks", "2"}, 1},
		{[]string{"sendrecv", "-b", "64K", "-e", "64K", "-n", "2", "--ranks", "2"}, 1},
		{[]string{"all_reduce", "-b", "1K", "-e", "1K", "-n", "2", "-d", "all", "-o", "all", "-c", "1"}, 50},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			out, errOut, code := rdmakit(t, append([]string{"coll-perf"}, tc.args...)...)
			if code != 0 {
				t.Fatalf("exit %d:\n%s\n%s", code, out, errOut)
			}
			rows := 0
			for _, l := range strings.Split(out, "\n") {
				if l == "" || strings.HasPrefix(l, "#") {
					continue
				}
				f := strings.Fields(l)
				if len(f) != 13 {
					t.Errorf("row %q has %d fields", l, len(f))
					continue
				}
				if f[8] != "0" || f[12] != "0" {
					t.Errorf("wrong elements: %q", l)
				}
				rows++
			}
			if rows != tc.lines {
				t.Errorf("%d rows, want %d:\n%s", rows, tc.lines, out)
			}
			for _, want := range []string{"#       size         count      type   redop    root     time   algbw   busbw  #wrong     time   algbw   busbw  #wrong",
				"# Out of bounds values : 0 OK", "# Avg bus bandwidth    : ", "# Collective test concluded: "} {
				if !strings.Contains(out, want) {
					t.Errorf("output lacks %q:\n%s", want, out)
				}
			}
		})
	}
}

func TestCollPerfUsage(t *testing.T) {
	if _, _, code := rdmakit(t, "coll-perf", "all_reduce_nope"); code != 2 {
		t.Errorf("unknown test: exit %d", code)
	}
	if _, _, code := rdmakit(t, "coll-perf", "all_reduce", "-b", "2M", "-e", "1M"); code != 2 {
		t.Errorf("bad range: exit %d", code)
	}
}

// TestCollPerfRoCE: --transport roce between local rank processes on the
// loopback interface's roce device (each rank on a port of the system's
// choosing, which coll-perf sets for the ranks it starts).
func TestCollPerfRoCE(t *testing.T) {
	t.Setenv("RDMAKIT_ROCE_IFACES", "lo")
	t.Setenv("RDMAKIT_ROCE_ADDR", "")
	os.Unsetenv("RDMAKIT_ROCE_ADDR")
	for _, args := range [][]string{
		{"all_reduce", "-b", "8", "-e", "1M", "-f", "128", "-n", "3", "--ranks", "3", "--transport", "roce"},
		{"all_gather", "-b", "1K", "-e", "64K", "-f", "64", "-n", "2", "--ranks", "2", "--transport", "roce"},
	} {
		out, errOut, code := rdmakit(t, append([]string{"coll-perf"}, args...)...)
		if code != 0 || !strings.Contains(out, "# Out of bounds values : 0 OK") {
			t.Errorf("%q: exit %d:\n%s\n%s", args, code, out, errOut)
		}
		if !strings.Contains(out, "roce port 1") {
			t.Errorf("%q: the ranks did not use roce:\n%s", args, out)
		}
	}
}
