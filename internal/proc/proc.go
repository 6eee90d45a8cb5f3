// Package proc reads what tests and benchmarks measure of a process in Linux's
// /proc: its memory (/proc/<pid>/status) and its CPU time (/proc/<pid>/stat). It
// imports nothing of the project, so that every package's tests may use it.
package proc

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// ClockTicks is USER_HZ, the unit of the times in /proc/<pid>/stat: 100 on Linux.
const ClockTicks = 100

// StatusKB returns the field of /proc/<pid>/status given in kB ("VmRSS",
// "RssAnon").
func StatusKB(pid int, field string) (int64, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for line := range strings.Lines(string(data)) {
		if rest, ok := strings.CutPrefix(line, field+":"); ok {
			return strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
		}
	}
	return 0, fmt.Errorf("no %s in /proc/%d/status", field, pid)
}

// CPUTicks returns the user and system time of pid, and that of the children it
// has reaped, in [ClockTicks].
func CPUTicks(pid int) (self, reaped int64, err error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, 0, err
	}
	// The fields after the command, which may hold spaces: state is field 3.
	f := strings.Fields(string(data[bytes.LastIndexByte(data, ')')+2:]))
	var t [4]int64 // utime, stime, cutime, cstime: fields 14 to 17
	for i := range t {
		if t[i], err = strconv.ParseInt(f[14-3+i], 10, 64); err != nil {
			return 0, 0, fmt.Errorf("/proc/%d/stat field %d: %w", pid, 14+i, err)
		}
	}
	return t[0] + t[1], t[2] + t[3], nil
}

// Children returns the children of pid (Linux 3.5 and later).
func Children(pid int) ([]int, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", pid, pid))
	if err != nil {
		return nil, err
	}
	var out []int
	for _, s := range strings.Fields(string(data)) {
		n, err := strconv.Atoi(s)
		if err != nil {
			return nil, err
		}
		out = append(out, n)
	}
	return out, nil
}
