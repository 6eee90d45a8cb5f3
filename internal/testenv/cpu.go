package testenv

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// clockTick is the unit of /proc/<pid>/stat's times: USER_HZ, 100 on every Linux
// this runs on (sysconf(_SC_CLK_TCK) needs cgo to ask).
const clockTick = 10 * time.Millisecond

// ProcessCPU returns the CPU time (user and system) of the host's processes whose
// command name (comm) starts with one of prefixes, as /proc says: the Docker engine's
// (dockerd, containerd, containerd-shim-runc-v2), for instance. A process that
// exits between two readings takes its time with it: read around work whose
// processes live through it.
func ProcessCPU(prefixes ...string) time.Duration {
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	var total time.Duration
	for _, path := range stats {
		b, err := os.ReadFile(path)
		if err != nil {
			continue
		}
		// pid (comm) state ... utime stime: comm may hold spaces and parentheses.
		open, closing := strings.IndexByte(string(b), '('), strings.LastIndexByte(string(b), ')')
		if open < 0 || closing < open {
			continue
		}
		comm := string(b[open+1 : closing])
		if !hasAnyPrefix(comm, prefixes) {
			continue
		}
		fields := strings.Fields(string(b[closing+1:]))
		if len(fields) < 13 {
			continue
		}
		utime, _ := strconv.ParseInt(fields[11], 10, 64)
		stime, _ := strconv.ParseInt(fields[12], 10, 64)
		total += time.Duration(utime+stime) * clockTick
	}
	return total
}

func hasAnyPrefix(s string, prefixes []string) bool {
	for _, p := range prefixes {
		if strings.HasPrefix(s, p) {
			return true
		}
	}
	return false
}

// SelfCPU returns this process's CPU time, user and system, all its threads.
func SelfCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
