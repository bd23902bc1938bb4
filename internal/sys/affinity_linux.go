//go:build linux

package sys

import (
	"fmt"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// BindProcess restricts every thread of this process, and so the threads
// it starts later (they inherit the mask), to the n-th CPU (counted mod
// their number) of those the calling thread may run on, as MPI launchers
// bind ranks to cores. It returns that CPU. Threads are listed from
// /proc/self/task; one that exits meanwhile is skipped.
func BindProcess(n int) (int, error) {
	var allowed unix.CPUSet
	if err := unix.SchedGetaffinity(0, &allowed); err != nil {
		return -1, err
	}
	k := allowed.Count()
	if k == 0 {
		return -1, fmt.Errorf("sched_getaffinity: no CPU")
	}
	n %= k
	cpu := -1
	for c := 0; c < len(allowed)*64 && cpu < 0; c++ {
		if allowed.IsSet(c) {
			if n == 0 {
				cpu = c
			}
			n--
		}
	}
	var set unix.CPUSet
	set.Set(cpu)
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		return -1, err
	}
	for _, t := range tasks {
		tid, err := strconv.Atoi(t.Name())
		if err != nil {
			continue
		}
		if err := unix.SchedSetaffinity(tid, &set); err != nil && err != unix.ESRCH {
			return -1, fmt.Errorf("sched_setaffinity(%d, cpu %d): %w", tid, cpu, err)
		}
	}
	return cpu, nil
}
