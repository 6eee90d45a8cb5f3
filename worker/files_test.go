package worker_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jazzmine/worker/client"
	"github.com/jazzmine/worker/internal/testenv"
	"github.com/jazzmine/worker/wire"
	"github.com/jazzmine/worker/worker"
)

// filesAgent is an agent with the Go client, for the files contract: it uploads,
// runs and downloads.
type filesAgent struct {
	t     *testing.T
	c     *client.Client
	store jetstream.ObjectStore
}

func newFilesAgent(t *testing.T, nc *nats.Conn) *filesAgent {
	t.Helper()
	c, err := client.New(client.Config{Conn: nc})
	if err != nil {
		t.Fatal(err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	// A worker that runs as a process of its own may take a while to make the bucket.
	deadline := time.Now().Add(3 * time.Minute)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		store, err := js.ObjectStore(ctx, wire.FilesBucket)
		cancel()
		switch {
		case err == nil:
			return &filesAgent{t: t, c: c, store: store}
		case time.Now().After(deadline):
			t.Fatalf("no worker made the bucket %s: %v", wire.FilesBucket, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func (a *filesAgent) run(job wire.Job) *client.Result {
	a.t.Helper()
	if job.Sandbox == "" {
		job.Sandbox = "default"
	}
	if job.ExecutionID == "" {
		job.ExecutionID = newID("files")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	res, err := a.c.Run(ctx, job)
	if err != nil {
		a.t.Fatalf("run %s: %v", job.ExecutionID, err)
	}
	return res
}

// download reads an artifact's object, which must match its announced size and hash.
func (a *filesAgent) download(art *client.Artifact) []byte {
	a.t.Helper()
	var buf bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := a.c.Download(ctx, art, &buf); err != nil {
		a.t.Fatalf("download %s: %v", art.Path, err)
	}
	return buf.Bytes()
}

// objects lists the names of the bucket's objects under prefix.
func (a *filesAgent) objects(prefix string) []string {
	a.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	infos, err := a.store.List(ctx)
	if err != nil && err != jetstream.ErrNoObjectsFound {
		a.t.Fatal(err)
	}
	var names []string
	for _, info := range infos {
		if strings.HasPrefix(info.Name, prefix) {
			names = append(names, info.Name)
		}
	}
	slices.Sort(names)
	return names
}

func sha256Hex(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

func artifactPaths(res *client.Result) []string {
	var paths []string
	for _, a := range res.Artifacts {
		paths = append(paths, a.Path)
	}
	return paths
}

// TestAnInlineFileGoesInAndTheWorkspacesFilesComeOut: a 200-byte inline file is in
// the workspace with its mode before the script runs; what the script leaves in out/
// (a subdirectory too) and a path the job asks for come back as artifacts, stored
// under the execution's own names, with the sizes and SHA-256 of their bytes.
func TestAnInlineFileGoesInAndTheWorkspacesFilesComeOut(t *testing.T) {
	_, nc := testenv.NATS(t)
	startWorker(t, nc, 1, 0, nil)
	a := newFilesAgent(t, nc)

	input := bytes.Repeat([]byte("jazz\x00\xff"), 200/6+1)[:200]
	id := newID("inline")
	res := a.run(wire.Job{ExecutionID: id, Files: []wire.File{{Path: "data/in.bin", Mode: 0o600, Data: input}},
		Artifacts: []string{"report.md", "missing.txt"},
		Script: `import os, stat, hashlib
st = os.stat("data/in.bin")
data = open("data/in.bin", "rb").read()
os.makedirs("out/sub")
open("out/copy.bin", "wb").write(data[::-1])
open("out/sub/table.csv", "w").write("a,b\n1,2\n")
open("report.md", "w").write("# report\n")
open("not-collected.txt", "w").write("x")
emit_result({"size": st.st_size, "mode": stat.S_IMODE(st.st_mode), "sha": hashlib.sha256(data).hexdigest()})`})
	if !res.Success {
		t.Fatalf("failed: %s %s %s", res.ErrorKind, res.Error, res.Traceback)
	}
	got := res.FinalData.(map[string]any)
	if got["size"] != int64(200) || got["mode"] != int64(0o600) || got["sha"] != sha256Hex(input) {
		t.Errorf("the script saw the input as %v; want 200 bytes, mode 0600, sha %s", got, sha256Hex(input))
	}
	if paths := artifactPaths(res); !slices.Equal(paths, []string{"out/copy.bin", "out/sub/table.csv", "report.md"}) {
		t.Fatalf("artifacts %v; want out/copy.bin, out/sub/table.csv, report.md", paths)
	}
	reversed := slices.Clone(input)
	slices.Reverse(reversed)
	want := map[string][]byte{"out/copy.bin": reversed, "out/sub/table.csv": []byte("a,b\n1,2\n"), "report.md": []byte("# report\n")}
	prefix := wire.ObjectPrefix(id, 1)
	for _, art := range res.Artifacts {
		if art.Object != wire.ArtifactObject(id, 1, art.Path) || art.SHA256 != sha256Hex(want[art.Path]) || art.Size != int64(len(want[art.Path])) {
			t.Errorf("artifact %+v; want object %s, %d bytes, sha %s", art, wire.ArtifactObject(id, 1, art.Path), len(want[art.Path]), sha256Hex(want[art.Path]))
		}
		if b := a.download(&art); !bytes.Equal(b, want[art.Path]) {
			t.Errorf("%s holds %q, want %q", art.Path, b, want[art.Path])
		}
	}
	if art := res.Artifacts[1]; art.ContentType != "text/csv" {
		t.Errorf("out/sub/table.csv has content type %q, want text/csv", art.ContentType)
	}
	if names := a.objects(prefix); len(names) != 3 {
		t.Errorf("objects under %s: %v; want the three artifacts", prefix, names)
	}
}

// TestLinksAndSpecialFilesCarryNothingOut plays a script that tries to carry files
// of the container out through its artifacts: symbolic links to /etc/passwd, to a
// directory outside the workspace and to the harness's own files, a FIFO (which
// would block a naive reader), a hard link attempt, and a link as a requested path.
// Only the regular file comes out; each of the others gets a warning.
func TestLinksAndSpecialFilesCarryNothingOut(t *testing.T) {
	_, nc := testenv.NATS(t)
	startWorker(t, nc, 1, 0, nil)
	a := newFilesAgent(t, nc)

	res := a.run(wire.Job{Mode: wire.ModeInteractive, Artifacts: []string{"etc-link", "tools-link"}, Script: `import os
os.makedirs("out")
os.symlink("/etc/passwd", "out/passwd")
os.symlink("/", "out/root")
os.symlink("../..", "out/up")
os.symlink("/etc", "etc-link")
os.symlink("/tools", "tools-link")
os.mkfifo("out/fifo")
try:
    os.link("/etc/passwd", "out/hard")
except OSError as e:
    print("no hard link:", e)
open("out/real.txt", "w").write("mine")`})
	if !res.Success {
		t.Fatalf("failed: %s %s %s", res.ErrorKind, res.Error, res.Traceback)
	}
	if paths := artifactPaths(res); !slices.Equal(paths, []string{"out/real.txt"}) {
		t.Fatalf("artifacts %v; want only out/real.txt", paths)
	}
	if b := a.download(&res.Artifacts[0]); string(b) != "mine" {
		t.Errorf("out/real.txt holds %q", b)
	}
	var warned []string
	for _, l := range res.Logs {
		if l.Level == "warning" {
			warned = append(warned, l.Message)
		}
	}
	for _, p := range []string{"out/passwd", "out/root", "out/up", "out/fifo"} {
		if !slices.ContainsFunc(warned, func(m string) bool { return strings.Contains(m, p) }) {
			t.Errorf("no warning names %s: %q", p, warned)
		}
	}
}

// TestArtifactLimitsStoreNothing: more files than max_artifacts, or more bytes than
// max_artifact_bytes, fail the execution with artifact_limit and store none of them.
func TestArtifactLimitsStoreNothing(t *testing.T) {
	_, nc := testenv.NATS(t)
	startWorker(t, nc, 1, 0, nil)
	a := newFilesAgent(t, nc)

	for _, tc := range []struct {
		name string
		job  wire.Job
		want string
	}{
		{"too many", wire.Job{MaxArtifacts: 3, Script: `import os
os.makedirs("out")
for i in range(4):
    open("out/f%d" % i, "w").write("x")
emit_result(1)`}, "4 files"},
		{"too big", wire.Job{MaxArtifactBytes: 1000, Script: `import os
os.makedirs("out")
open("out/a", "wb").write(b"x" * 600)
open("out/b", "wb").write(b"y" * 600)
emit_result(1)`}, "1200 bytes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a.t = t
			tc.job.ExecutionID = newID("limit")
			res := a.run(tc.job)
			if res.Success || res.ErrorKind != wire.KindArtifactLimit || !strings.Contains(res.Error, tc.want) {
				t.Errorf("success %v, %s: %s; want an artifact_limit error naming %s", res.Success, res.ErrorKind, res.Error, tc.want)
			}
			if len(res.Artifacts) != 0 {
				t.Errorf("artifacts %v announced past the limit", artifactPaths(res))
			}
			if names := a.objects(wire.ObjectPrefix(tc.job.ExecutionID, 1)); len(names) != 0 {
				t.Errorf("objects stored past the limit: %v", names)
			}
		})
	}
}

// TestInputFileErrorsEndTheJobBeforeTheScript: an object that is not in the bucket,
// and files larger than the sandbox's workspace, end the job with input_file; the
// script never runs.
func TestInputFileErrorsEndTheJobBeforeTheScript(t *testing.T) {
	_, nc := testenv.NATS(t)
	startWorker(t, nc, 1, 0, func(c *worker.Config) { c.Sandboxes[0].MaxInputBytes = 1000 })
	a := newFilesAgent(t, nc)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := a.c.PutFile(ctx, "uploads/big", bytes.NewReader(make([]byte, 1001))); err != nil {
		t.Fatal(err)
	}
	script := "emit_intermediate('ran', 1)\nemit_result(1)"
	for _, tc := range []struct {
		name  string
		files []wire.File
		want  string
	}{
		{"a missing object", []wire.File{{Path: "a.csv", Object: "uploads/nope"}}, `input file a.csv: object "uploads/nope" is not in the bucket JAZZMINE_FILES`},
		{"more than the workspace", []wire.File{{Path: "big", Object: "uploads/big"}}, "input files are 1001 bytes in all, more than the workspace of this sandbox holds (1000 bytes)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a.t = t
			res := a.run(wire.Job{Files: tc.files, Script: script})
			if res.Success || res.ErrorKind != wire.KindInputFile || res.Error != tc.want {
				t.Errorf("success %v, %s: %q; want input_file: %q", res.Success, res.ErrorKind, res.Error, tc.want)
			}
			if len(res.Intermediates) != 0 {
				t.Errorf("the script ran")
			}
		})
	}
}

// TestAnExecutionsArtifactsAreItsOwn: two executions leave files of the same paths;
// each one's events name objects under its own prefix only, which hold its own
// bytes, and a later execution of the same container finds nothing of the first.
func TestAnExecutionsArtifactsAreItsOwn(t *testing.T) {
	_, nc := testenv.NATS(t)
	startWorker(t, nc, 1, 0, nil) // one container: the second runs where the first did
	a := newFilesAgent(t, nc)

	script := func(secret string) string {
		return `import os
left = sorted(os.listdir("."))
os.makedirs("out")
open("out/secret.txt", "w").write("` + secret + `")
emit_result(left)`
	}
	first, second := newID("own"), newID("own")
	r1 := a.run(wire.Job{ExecutionID: first, Script: script("first")})
	r2 := a.run(wire.Job{ExecutionID: second, Script: script("second")})
	for _, tc := range []struct {
		id, secret string
		res        *client.Result
	}{{first, "first", r1}, {second, "second", r2}} {
		if !tc.res.Success || len(tc.res.Artifacts) != 1 {
			t.Fatalf("%s: %v %s %v", tc.id, tc.res.Success, tc.res.Error, artifactPaths(tc.res))
		}
		art := tc.res.Artifacts[0]
		if art.Object != wire.ArtifactObject(tc.id, 1, "out/secret.txt") {
			t.Errorf("%s's artifact is object %s", tc.id, art.Object)
		}
		if b := a.download(&art); string(b) != tc.secret {
			t.Errorf("%s's artifact holds %q", tc.id, b)
		}
	}
	if left, _ := r2.FinalData.([]any); len(left) != 0 {
		t.Errorf("the second execution found %v in its workspace", left)
	}
}

// TestDisplayRendersWhatJupyterWould: display() of an object with _repr_html_ and
// _repr_svg_ gives its text forms inline and its SVG image through the object store;
// of a plain string, its text.
func TestDisplayRendersWhatJupyterWould(t *testing.T) {
	_, nc := testenv.NATS(t)
	startWorker(t, nc, 1, 0, nil)
	a := newFilesAgent(t, nc)

	svg := `<svg xmlns="http://www.w3.org/2000/svg" width="10" height="10"><rect width="10" height="10"/></svg>`
	res := a.run(wire.Job{Mode: wire.ModeInteractive, Script: `class Card:
    def _repr_html_(self): return "<b>card</b>"
    def _repr_markdown_(self): return "**card**"
    def _repr_svg_(self): return '` + svg + `'
    def __repr__(self): return "Card()"
display(Card())
display("just text")`})
	if !res.Success || len(res.Displays) != 2 {
		t.Fatalf("success %v (%s), %d displays", res.Success, res.Error, len(res.Displays))
	}
	d := res.Displays[0]
	if d.Data["text/html"] != "<b>card</b>" || d.Data["text/markdown"] != "**card**" || d.Data["text/plain"] != "Card()" {
		t.Errorf("text forms %v", d.Data)
	}
	if d.Image == nil || d.Image.ContentType != "image/svg+xml" {
		t.Fatalf("image %+v; want an SVG", d.Image)
	}
	if b := a.download(d.Image); string(b) != svg {
		t.Errorf("the SVG object holds %q", b)
	}
	if d := res.Displays[1]; d.Data["text/plain"] != "'just text'" || d.Image != nil {
		t.Errorf("display of a str: %+v, want its repr, as IPython shows it", d)
	}
}
