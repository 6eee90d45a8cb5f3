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
		if comm, cpu, ok := statCPU(path); ok && hasAnyPrefix(comm, prefixes) {
			total += cpu
		}
	}
	return total
}

// PIDCPU returns the CPU time (user and system) of the process with the pid, or 0
// once it has exited.
func PIDCPU(pid int) time.Duration {
	_, cpu, _ := statCPU("/proc/" + strconv.Itoa(pid) + "/stat")
	return cpu
}

// statCPU reads a process's command name and CPU time from its stat file.
func statCPU(path string) (comm string, cpu time.Duration, ok bool) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", 0, false
	}
	// pid (comm) state ... utime stime: comm may hold spaces and parentheses.
	open, closing := strings.IndexByte(string(b), '('), strings.LastIndexByte(string(b), ')')
	if open < 0 || closing < open {
		return "", 0, false
	}
	fields := strings.Fields(string(b[closing+1:]))
	if len(fields) < 13 {
		return "", 0, false
	}
	utime, _ := strconv.ParseInt(fields[11], 10, 64)
	stime, _ := strconv.ParseInt(fields[12], 10, 64)
	return string(b[open+1 : closing]), time.Duration(utime+stime) * clockTick, true
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
