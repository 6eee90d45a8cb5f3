package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jazzmine/worker/client"
	"github.com/jazzmine/worker/internal/testenv"
	"github.com/jazzmine/worker/internal/testworker"
	"github.com/jazzmine/worker/sandboxpool"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// TestSubmitSendsFilesAndSavesArtifacts: `worker submit --file LOCAL[:PATH] --out DIR`
// puts a small file in the job and a large one in the object store, and saves what
// the script left in out/ and what it displayed under DIR, at their paths.
func TestSubmitSendsFilesAndSavesArtifacts(t *testing.T) {
	srv, nc := testenv.NATS(t)
	testworker.Start(t, nc, testworker.Options{Sandbox: sandboxpool.Sandbox{PoolSize: 1}})
	dir := t.TempDir()
	small, large := filepath.Join(dir, "small.txt"), filepath.Join(dir, "large.bin")
	if err := os.WriteFile(small, []byte("hello"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(large, bytes.Repeat([]byte("L"), client.InlineLimit+1), 0o644); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "out")
	var stdout, stderr bytes.Buffer
	env := func(k string) string {
		if k == "NATS_URL" {
			return srv.ClientURL()
		}
		return ""
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	err := submit(ctx, []string{"--file", small + ":in/s.txt", "--file", large, "--out", out, "-e", `import os
os.makedirs("out")
open("out/both.txt", "w").write(open("in/s.txt").read() + str(os.path.getsize("large.bin")))
class Pic:
    def _repr_svg_(self): return "<svg/>"
display(Pic())
emit_result(1)`}, env, strings.NewReader(""), &stdout, &stderr)
	if err != nil {
		t.Fatalf("submit: %v\n%s%s", err, stdout.String(), stderr.String())
	}
	if b, err := os.ReadFile(filepath.Join(out, "out", "both.txt")); err != nil || string(b) != "hello65537" {
		t.Errorf("out/both.txt: %q %v", b, err)
	}
	if b, err := os.ReadFile(filepath.Join(out, "display", "1.svg")); err != nil || string(b) != "<svg/>" {
		t.Errorf("display/1.svg: %q %v", b, err)
	}
	for _, want := range []string{"artifact      out/both.txt (10 bytes, text/plain", "saved " + filepath.Join(out, "display", "1.svg")} {
		if !strings.Contains(stdout.String(), want) {
			t.Errorf("the output does not say %q:\n%s", want, stdout.String())
		}
	}
}
