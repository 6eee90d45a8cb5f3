package worker_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"image"
	_ "image/png" // image.DecodeConfig reads the charts
	"io"
	"strings"
	"testing"
	"time"

	"github.com/jazzmine/worker/internal/proc"
	"github.com/jazzmine/worker/internal/testenv"
	"github.com/jazzmine/worker/internal/testworker"
	"github.com/jazzmine/worker/sandboxpool"
	"github.com/jazzmine/worker/wire"
)

// salesCSV writes a CSV of about size bytes, the same every time: region, product,
// units, price. It returns the units per region, added up.
func salesCSV(w io.Writer, size int) map[string]int64 {
	regions := []string{"east", "north", "south", "west"}
	sums := map[string]int64{}
	fmt.Fprintln(w, "region,product,units,price")
	n := 27
	for i := 0; n < size; i++ {
		region := regions[(i*7)%len(regions)]
		units := int64(i % 97)
		sums[region] += units
		l, _ := fmt.Fprintf(w, "%s,product-%05d,%d,%d.%02d\n", region, i%10007, units, i%500, i%100)
		n += l
	}
	return sums
}

// TestACSVInByReferenceAChartAndATableOut is the data-science round trip: a 20 MB
// CSV goes in by reference to an object, pandas aggregates it, and a PNG chart and
// the aggregate as CSV come back as artifacts with the right SHA-256; the figure
// shown and the table displayed come back as display events, the PNG decoding as an
// image of the figure's size.
func TestACSVInByReferenceAChartAndATableOut(t *testing.T) {
	_, nc := testenv.NATS(t)
	testworker.Start(t, nc, testworker.Options{Spec: "datascience", Sandbox: sandboxpool.Sandbox{PoolSize: 1}})
	a := newFilesAgent(t, nc)

	var csv bytes.Buffer
	sums := salesCSV(&csv, 20<<20)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	object := "uploads/" + newID("sales") + "/sales.csv"
	if err := a.c.PutFile(ctx, object, &csv); err != nil {
		t.Fatal(err)
	}
	res := a.run(wire.Job{Sandbox: "datascience", TimeoutSec: 120, Files: []wire.File{{Path: "data/sales.csv", Object: object}},
		Script: `import os
import pandas as pd
import matplotlib.pyplot as plt
df = pd.read_csv("data/sales.csv")
agg = df.groupby("region")["units"].sum().sort_index()
os.makedirs("out")
agg.to_csv("out/summary.csv")
fig, ax = plt.subplots(figsize=(4, 3), dpi=100)
agg.plot.bar(ax=ax)
fig.savefig("out/chart.png")
display(agg.to_frame())
plt.show()
emit_result({k: int(v) for k, v in agg.items()})`})
	if !res.Success {
		t.Fatalf("failed: %s %s\n%s\n%s", res.ErrorKind, res.Error, res.Traceback, res.Stderr)
	}
	var want strings.Builder
	want.WriteString("region,units\n")
	for _, r := range []string{"east", "north", "south", "west"} {
		if got := res.FinalData.(map[string]any)[r]; got != sums[r] {
			t.Errorf("units of %s: pandas says %v, want %d", r, got, sums[r])
		}
		fmt.Fprintf(&want, "%s,%d\n", r, sums[r])
	}

	if paths := artifactPaths(res); strings.Join(paths, " ") != "out/chart.png out/summary.csv" {
		t.Fatalf("artifacts %v; want out/chart.png and out/summary.csv", paths)
	}
	for _, art := range res.Artifacts {
		b := a.download(&art)
		if sum := sha256.Sum256(b); art.SHA256 != hex.EncodeToString(sum[:]) {
			t.Errorf("%s: announced sha256 %s, its bytes hash to %x", art.Path, art.SHA256, sum)
		}
		switch art.Path {
		case "out/summary.csv":
			if string(b) != want.String() {
				t.Errorf("summary.csv holds %q, want %q", b, want.String())
			}
		case "out/chart.png":
			checkPNG(t, "out/chart.png", b, 400, 300)
		}
	}

	if len(res.Displays) != 2 {
		t.Fatalf("%d displays, want the table and the figure", len(res.Displays))
	}
	if table := res.Displays[0]; !strings.Contains(table.Data["text/html"], "<table") || !strings.Contains(table.Data["text/plain"], "east") || table.Image != nil {
		t.Errorf("the table's display: %+v", table)
	}
	shown := res.Displays[1]
	if shown.Image == nil || shown.Image.ContentType != "image/png" || !strings.HasPrefix(shown.Image.Path, "display/") {
		t.Fatalf("the figure's display: %+v", shown)
	}
	checkPNG(t, shown.Image.Path, a.download(shown.Image), 400, 300)
}

func checkPNG(t *testing.T, name string, b []byte, width, height int) {
	t.Helper()
	cfg, format, err := image.DecodeConfig(bytes.NewReader(b))
	if err != nil || format != "png" || cfg.Width != width || cfg.Height != height {
		t.Errorf("%s: %s %dx%d (%v); want a %dx%d PNG", name, format, cfg.Width, cfg.Height, err, width, height)
	}
}

// TestALargeInputStreamsThroughTheWorker runs the worker binary against the test's
// NATS server and gives a job a 100 MB input file by reference: the worker's memory
// (its resident set, sampled while the file streams into the container) stays within
// 20 MB of what it was idle, and the script finds every byte.
func TestALargeInputStreamsThroughTheWorker(t *testing.T) {
	if testing.Short() {
		t.Skip("streams 100 MB")
	}
	srv, nc := testenv.NATS(t)
	testenv.SandboxImage(t) // built here, not by the worker, whose memory is measured
	w := startProcess(t, writeConfigWith(t, "", "resources: {workspace_mb: 160}\n    pool: {size: 1, max_overflow: 0}"), srv.ClientURL(), newID("memory"))
	ctx := context.Background()

	a := newFilesAgent(t, nc)
	// Warm up: the first job, so that the idle size is a worker that has run one.
	if res := a.run(wire.Job{Files: []wire.File{{Path: "x", Data: []byte("x")}}, Script: "emit_result(open('x').read())"}); !res.Success {
		t.Fatalf("warm-up: %s", res.Error)
	}
	idle := rss(w.cmd.Process.Pid)

	const size = 100 << 20
	h := sha256.New()
	if err := a.c.PutFile(ctx, "uploads/big.bin", io.TeeReader(io.LimitReader(pattern{}, size), h)); err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	peak := make(chan int64)
	go func() {
		var most int64
		for {
			select {
			case <-stop:
				peak <- most
				return
			case <-time.After(10 * time.Millisecond):
				most = max(most, rss(w.cmd.Process.Pid))
			}
		}
	}()
	started := time.Now()
	res := a.run(wire.Job{TimeoutSec: 120, Files: []wire.File{{Path: "big.bin", Object: "uploads/big.bin"}}, Script: `import hashlib, os
h = hashlib.sha256()
with open("big.bin", "rb") as f:
    for block in iter(lambda: f.read(1 << 20), b""):
        h.update(block)
emit_result({"size": os.path.getsize("big.bin"), "sha": h.hexdigest()})`})
	took := time.Since(started)
	close(stop)
	most := <-peak
	if !res.Success {
		t.Fatalf("failed: %s %s", res.ErrorKind, res.Error)
	}
	got := res.FinalData.(map[string]any)
	if got["size"] != int64(size) || got["sha"] != hex.EncodeToString(h.Sum(nil)) {
		t.Errorf("the script found %v", got)
	}
	t.Logf("worker RSS idle %.1f MB, at most %.1f MB while 100 MB streamed in; the job took %v from submit to result (the script hashing the file included)", float64(idle)/(1<<20), float64(most)/(1<<20), took.Round(time.Millisecond))
	if most-idle > 20<<20 {
		t.Errorf("the worker grew by %.1f MB while the file streamed in: more than 20 MB", float64(most-idle)/(1<<20))
	}
	w.stop(t)
}

// pattern is an endless reader of bytes that do not compress to nothing.
type pattern struct{}

func (pattern) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = byte(i*31 + i>>8)
	}
	return len(p), nil
}

// rss is the resident set of process pid, in bytes; 0 once it has gone.
func rss(pid int) int64 {
	kb, _ := proc.StatusKB(pid, "VmRSS")
	return kb << 10
}
