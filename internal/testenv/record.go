package testenv

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// BenchOutEnv names the directory where benchmarks record their samples for the
// report that make bench writes (internal/benchreport). Unset, nothing is recorded.
const BenchOutEnv = "JAZZMINE_BENCH_OUT"

// Sample is what one benchmark recorded: latency samples and named values.
type Sample struct {
	Name      string             `json:"name"`
	LatencyNS []int64            `json:"latency_ns,omitempty"`
	Values    map[string]float64 `json:"values,omitempty"`
	When      time.Time          `json:"when"`
}

// Record writes the latency samples and values of benchmark tb (its name, then
// suffix) as JSON into the directory named by BenchOutEnv, if it is set. A later
// run of the same benchmark replaces the file: b.N rounds before the last are
// warm-ups of the testing package.
func Record(tb testing.TB, suffix string, lat []time.Duration, values map[string]float64) {
	dir := os.Getenv(BenchOutEnv)
	if dir == "" {
		return
	}
	name := tb.Name()
	if suffix = strings.Trim(suffix, "-"); suffix != "" {
		name += "/" + suffix
	}
	s := Sample{Name: name, Values: values, When: time.Now().UTC()}
	for _, d := range lat {
		s.LatencyNS = append(s.LatencyNS, d.Nanoseconds())
	}
	data, err := json.Marshal(s)
	if err != nil {
		tb.Fatalf("record %s: %v", name, err)
	}
	file := filepath.Join(dir, strings.NewReplacer("/", "__", "=", "-").Replace(name)+".json")
	if err := os.WriteFile(file, data, 0o644); err != nil {
		tb.Fatalf("record %s: %v", name, err)
	}
}
