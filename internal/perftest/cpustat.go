package perftest

// --cpu_util: the host's CPU time from /proc/stat, read at the start and
// the end of a duration run's measured window (on the run's goroutine,
// twice per run, never per operation).

import (
	"bufio"
	"os"
	"strconv"
	"strings"
)

// cpuStat is the aggregate "cpu" line's user and idle times (jiffies).
type cpuStat struct{ user, idle int64 }

// readCPUStat reads /proc/stat; zero where it cannot (then the figure is 0).
func readCPUStat() cpuStat {
	f, err := os.Open("/proc/stat")
	if err != nil {
		return cpuStat{}
	}
	defer f.Close()
	line, _ := bufio.NewReader(f).ReadString('\n')
	return parseCPUStat(line)
}

// parseCPUStat reads "cpu user nice system idle ...".
func parseCPUStat(line string) cpuStat {
	w := strings.Fields(line)
	if len(w) < 5 || w[0] != "cpu" {
		return cpuStat{}
	}
	user, err1 := strconv.ParseInt(w[1], 10, 64)
	idle, err2 := strconv.ParseInt(w[4], 10, 64)
	if err1 != nil || err2 != nil {
		return cpuStat{}
	}
	return cpuStat{user: user, idle: idle}
}

// utilSince is perftest's figure: user time over user plus idle time
// between two readings, in percent.
func (s cpuStat) utilSince(start cpuStat) float64 {
	u, i := s.user-start.user, s.idle-start.idle
	if u < 0 || i < 0 || u+i == 0 {
		return 0
	}
	return float64(u) / float64(u+i) * 100
}
