package imagebuild

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/moby/moby/api/types/build"
	"github.com/moby/moby/api/types/jsonstream"

	"github.com/jazzmine/worker/harness"
)

func newTestBuilder(t *testing.T, docker Docker, progress *bytes.Buffer) *Builder {
	t.Helper()
	cfg := BuilderConfig{Docker: docker}
	if progress != nil {
		cfg.Progress = progress
	}
	b, err := NewBuilder(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func builderFiles() map[string]string {
	return map[string]string{
		"config.yaml":          "sandboxes:\n  default: {tools: [tools/*.py], requirements: [mypkg==0.1], wheelhouse: wheels}\n",
		"tools/text.py":        "def word_count(s): return len(s.split())\n",
		"wheels/mypkg-0.1.whl": "wheel",
	}
}

func TestNewBuilderNeedsDocker(t *testing.T) {
	if _, err := NewBuilder(BuilderConfig{}); err == nil {
		t.Fatal("NewBuilder without Docker succeeded")
	}
}

func TestAnUnchangedChecksumNeverRebuilds(t *testing.T) {
	fake := newFakeDocker()
	b := newTestBuilder(t, fake, nil)
	ctx := context.Background()

	first, err := b.Ensure(ctx, mustParse(t, builderFiles()).Sandboxes["default"])
	if err != nil {
		t.Fatal(err)
	}
	if !first.Built || first.ID == "" || fake.buildCount() != 1 {
		t.Fatalf("first Ensure: %+v, %d builds", first, fake.buildCount())
	}
	if want := Tag("default", first.Checksum); first.Tag != want || !strings.HasPrefix(want, "jazzmine-sandbox-default:") {
		t.Errorf("tag %q, want %q", first.Tag, want)
	}

	// The same files, loaded again, as after a restart of the worker.
	again, err := b.Ensure(ctx, mustParse(t, builderFiles()).Sandboxes["default"])
	if err != nil {
		t.Fatal(err)
	}
	if again.Built || again.Tag != first.Tag || again.ID != first.ID || fake.buildCount() != 1 {
		t.Errorf("second Ensure: %+v, %d builds; want the first image, unbuilt, and 1 build", again, fake.buildCount())
	}

	files := builderFiles()
	files["tools/text.py"] += "# changed\n"
	changed, err := b.Ensure(ctx, mustParse(t, files).Sandboxes["default"])
	if err != nil {
		t.Fatal(err)
	}
	if !changed.Built || changed.Tag == first.Tag || fake.buildCount() != 2 {
		t.Errorf("after a tool changed: %+v, %d builds; want a new tag and a build", changed, fake.buildCount())
	}
}

func TestABuildSendsTheContextAndOptions(t *testing.T) {
	fake := newFakeDocker()
	b := newTestBuilder(t, fake, nil)
	spec := mustParse(t, builderFiles()).Sandboxes["default"]
	img, err := b.Ensure(context.Background(), spec)
	if err != nil {
		t.Fatal(err)
	}
	got := fake.builds[0]
	o := got.options
	if len(o.Tags) != 1 || o.Tags[0] != img.Tag || !o.Remove || !o.ForceRemove || o.PullParent || o.Version != build.BuilderV1 {
		t.Errorf("options: tags %v, remove %v, forcerm %v, pull %v, version %q", o.Tags, o.Remove, o.ForceRemove, o.PullParent, o.Version)
	}
	// The Dockerfile built is the checksummed one plus the checksum label.
	label := fmt.Sprintf(` jazzmine.checksum=%q`, img.Checksum)
	if built := string(got.files["Dockerfile"]); built != strings.TrimSuffix(Dockerfile(spec), "\n")+label+"\n" {
		t.Errorf("the Dockerfile built is not the checksummed one plus %s:\n%s", label, built)
	}
	wantFiles := map[string]string{
		"rootfs/tools/text.py":             "def word_count(s): return len(s.split())\n",
		"install/requirements.txt":         "mypkg==0.1\n",
		"install/wheelhouse/mypkg-0.1.whl": "wheel",
	}
	wantModes := map[string]int64{"rootfs/tools/text.py": 0o444, "rootfs/tools": 0o555, "rootfs/opt/jazzmine": 0o555}
	harnessNames := harnessContext(t, wantFiles, wantModes)
	for name, want := range wantFiles {
		if got := string(got.files[name]); got != want {
			t.Errorf("context file %s differs: %d bytes, want %d (%.40q...)", name, len(got), len(want), want)
		}
	}
	var names []string
	for name := range got.files {
		names = append(names, name)
	}
	sort.Strings(names)
	if want := "Dockerfile install install/requirements.txt install/wheelhouse install/wheelhouse/mypkg-0.1.whl rootfs/opt rootfs/opt/jazzmine " + harnessNames + " rootfs/tools rootfs/tools/text.py"; strings.Join(names, " ") != want {
		t.Errorf("context holds %v\nwant %s", names, want)
	}
	for name, want := range wantModes {
		if got.modes[name] != want {
			t.Errorf("mode of %s is %#o, want %#o", name, got.modes[name], want)
		}
	}
	if strings.Contains(Dockerfile(spec), img.Checksum) {
		t.Error("the checksummed Dockerfile holds the checksum that covers it")
	}
}

// harnessContext adds the harness's files, as a build context should hold them, to
// files (their contents) and modes, and returns their names and their directories',
// sorted and joined with spaces.
func harnessContext(t *testing.T, files map[string]string, modes map[string]int64) string {
	t.Helper()
	var names []string
	err := fs.WalkDir(harness.Source(), ".", func(name string, d fs.DirEntry, err error) error {
		if err != nil || name == "." {
			return err
		}
		ctx := "rootfs/opt/jazzmine/" + name
		names = append(names, ctx)
		if d.IsDir() {
			modes[ctx] = 0o555
			return nil
		}
		b, err := fs.ReadFile(harness.Source(), name)
		files[ctx], modes[ctx] = string(b), 0o444
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"__init__.py", "__main__.py", "protocol.py"} {
		if _, ok := files["rootfs/opt/jazzmine/"+harness.Package+"/"+name]; !ok {
			t.Fatalf("the harness's source has no %s: %v", name, names)
		}
	}
	sort.Strings(names)
	return strings.Join(names, " ")
}

func TestConcurrentCallersShareOneBuild(t *testing.T) {
	const callers = 8
	fake := newFakeDocker()
	spec := mustParse(t, builderFiles()).Sandboxes["default"]
	tag := Tag(spec.Name, Checksum(spec, "sha256:base"))

	// The build goes on only once every caller has looked for the tag (plus the
	// flight's own look), so that without sharing every caller would build.
	fake.onBuild = func(context.Context) {
		deadline := time.Now().Add(10 * time.Second)
		for fake.inspections(tag) < callers+1 {
			if time.Now().After(deadline) {
				t.Errorf("only %d lookups of %s", fake.inspections(tag), tag)
				return
			}
			time.Sleep(time.Millisecond)
		}
	}
	b := newTestBuilder(t, fake, nil)
	var wg sync.WaitGroup
	images := make([]Image, callers)
	errs := make([]error, callers)
	for i := range callers {
		wg.Go(func() { images[i], errs[i] = b.Ensure(context.Background(), spec) })
	}
	wg.Wait()
	for i := range callers {
		if errs[i] != nil {
			t.Fatalf("caller %d: %v", i, errs[i])
		}
		if images[i].Tag != tag || images[i].ID != images[0].ID {
			t.Errorf("caller %d got %+v, caller 0 %+v", i, images[i], images[0])
		}
	}
	if n := fake.buildCount(); n != 1 {
		t.Errorf("%d builds for %d concurrent callers, want 1", n, callers)
	}
}

func TestACallerThatGivesUpLeavesTheBuildRunning(t *testing.T) {
	fake := newFakeDocker()
	release := make(chan struct{})
	started := make(chan struct{})
	fake.onBuild = func(context.Context) { close(started); <-release }
	b := newTestBuilder(t, fake, nil)
	spec := mustParse(t, builderFiles()).Sandboxes["default"]

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { _, err := b.Ensure(ctx, spec); done <- err }()
	<-started
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("Ensure after cancel: %v, want context.Canceled", err)
	}
	close(release)
	img, err := b.Ensure(context.Background(), spec)
	if err != nil {
		t.Fatal(err)
	}
	if img.ID == "" || fake.buildCount() != 1 {
		t.Errorf("after the given-up build: %+v, %d builds; want its image and 1 build", img, fake.buildCount())
	}
}

func TestAFailedBuildReturnsABuildErrorWithTheLogTail(t *testing.T) {
	fake := newFakeDocker()
	for i := 1; i <= 60; i++ {
		fake.messages = append(fake.messages, jsonstream.Message{Stream: fmt.Sprintf("Step %d/60 : RUN step %d", i, i)}, jsonstream.Message{Stream: "\n"})
	}
	fake.fail = "The command '/bin/sh -c pip install' returned a non-zero code: 1"
	var progress bytes.Buffer
	b := newTestBuilder(t, fake, &progress)

	_, err := b.Ensure(context.Background(), mustParse(t, builderFiles()).Sandboxes["default"])
	var be *BuildError
	if !errors.As(err, &be) {
		t.Fatalf("Ensure: %v, want a *BuildError", err)
	}
	if be.Sandbox != "default" || !strings.HasPrefix(be.Tag, "jazzmine-sandbox-default:") {
		t.Errorf("BuildError sandbox %q, tag %q", be.Sandbox, be.Tag)
	}
	if len(be.LogTail) != 50 || be.LogTail[0] != "Step 12/60 : RUN step 12" || be.LogTail[49] != "ERROR: "+fake.fail {
		t.Errorf("log tail has %d lines, from %q to %q", len(be.LogTail), be.LogTail[0], be.LogTail[len(be.LogTail)-1])
	}
	msg := err.Error()
	for _, want := range []string{fake.fail, "Step 60/60 : RUN step 60", "Step 12/60", be.Tag} {
		if !strings.Contains(msg, want) {
			t.Errorf("error message lacks %q:\n%s", want, msg)
		}
	}
	if strings.Contains(msg, "Step 11/60") {
		t.Error("error message holds more than the tail")
	}
	if !strings.Contains(progress.String(), "imagebuild: default: step 1/60 RUN step 1 (") ||
		!strings.Contains(progress.String(), "imagebuild: default: step 60/60 RUN step 60 (failed after ") {
		t.Errorf("progress lacks the first step, or the last one's failure:\n%s", progress.String())
	}
	if _, ok := fake.images[be.Tag]; ok {
		t.Error("a failed build left its tag")
	}
}

func TestAnEngineErrorReturnsABuildError(t *testing.T) {
	fake := newFakeDocker()
	fake.buildErr = errors.New("connection reset")
	b := newTestBuilder(t, fake, nil)
	_, err := b.Ensure(context.Background(), mustParse(t, builderFiles()).Sandboxes["default"])
	var be *BuildError
	if !errors.As(err, &be) || !errors.Is(err, fake.buildErr) {
		t.Fatalf("Ensure: %v, want a *BuildError wrapping the engine's error", err)
	}
}

func TestAMissingBaseImageSaysHowToBuildIt(t *testing.T) {
	fake := newFakeDocker()
	delete(fake.images, DefaultBaseImage)
	b := newTestBuilder(t, fake, nil)
	_, err := b.Ensure(context.Background(), mustParse(t, builderFiles()).Sandboxes["default"])
	if err == nil || !strings.Contains(err.Error(), `base image "jazzmine-python-base:bookworm" not found: build it with "make base-image"`) {
		t.Fatalf("Ensure: %v", err)
	}
	if fake.buildCount() != 0 {
		t.Error("built without a base image")
	}
}

func TestAWheelChangedAfterLoadingFailsTheBuild(t *testing.T) {
	dir := writeTree(t, builderFiles())
	cfg, err := LoadConfig(filepath.Join(dir, "config.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "wheels", "mypkg-0.1.whl"), []byte("wheeL"), 0o644); err != nil {
		t.Fatal(err)
	}
	fake := newFakeDocker()
	_, err = newTestBuilder(t, fake, nil).Ensure(context.Background(), cfg.Sandboxes["default"])
	if err == nil || !strings.Contains(err.Error(), "changed since the config was loaded") {
		t.Fatalf("Ensure: %v", err)
	}
	if fake.buildCount() != 0 {
		t.Error("built with a wheel the checksum does not describe")
	}
}

func TestEnsureAllBuildsEverySandboxAndReportsEveryFailure(t *testing.T) {
	cfg := mustParse(t, map[string]string{
		"config.yaml": "sandboxes:\n  a: {}\n  b: {base_image: missing:1}\n  c: {}\n",
	})
	fake := newFakeDocker()
	images, err := newTestBuilder(t, fake, nil).EnsureAll(context.Background(), cfg)
	if err == nil || !strings.Contains(err.Error(), `sandbox "b": base image "missing:1" not found`) {
		t.Errorf("EnsureAll error: %v", err)
	}
	if len(images) != 2 || images["a"].ID == "" || images["c"].ID == "" {
		t.Errorf("images: %+v", images)
	}
}

func TestBuildOutputJoinsSplitLines(t *testing.T) {
	b := newTestBuilder(t, newFakeDocker(), nil)
	o := &buildOutput{sandbox: "s", b: b, now: time.Now}
	stream := `{"stream":"Step 1/2 : RUN a"}{"stream":"\n ---\u003e Running in 1"}{"stream":"23456789abc\n"}` +
		`{"stream":"progress\r50%\rdone"}{"status":"Downloading","progressDetail":{"current":1}}` +
		`{"stream":"\nRemoving intermediate container 123456789abc\n ---\u003e 0123456789ab\n"}`
	if err := o.read(strings.NewReader(stream)); err != nil {
		t.Fatal(err)
	}
	want := []string{"Step 1/2 : RUN a", " ---> Running in 123456789abc", "progress", "50%", "done",
		"Removing intermediate container 123456789abc", " ---> 0123456789ab"}
	if strings.Join(o.tail, "|") != strings.Join(want, "|") {
		t.Errorf("lines %q, want %q", o.tail, want)
	}
	if err := o.read(strings.NewReader(`{"stream":"x"} not json`)); err == nil {
		t.Error("a broken stream is not an error")
	}
}

// clock is a fake clock that moves on by a second each time it is read.
type clock struct{ t time.Time }

func (c *clock) now() time.Time {
	c.t = c.t.Add(time.Second)
	return c.t
}

func TestProgressIsALineAStepWithItsTime(t *testing.T) {
	var progress bytes.Buffer
	b := newTestBuilder(t, newFakeDocker(), &progress)
	c := &clock{}
	o := &buildOutput{sandbox: "datascience", b: b, now: c.now}
	long := "RUN apt-get update && apt-get install -y --no-install-recommends " + strings.Repeat("python3-x ", 20)
	stream := `{"stream":"Step 1/3 : FROM jazzmine-python-base:bookworm\n"}{"stream":" ---\u003e 0123456789ab\n"}` +
		`{"stream":"Step 2/3 : ` + long + `\n"}{"stream":" ---\u003e Running in 123456789abc\n"}` +
		`{"stream":"Get:1 http://deb.debian.org/debian bookworm InRelease [151 kB]\n"}` +
		`{"stream":"Step 3/3 : LABEL    a=b\n"}{"stream":"Successfully built 0123456789ab\n"}`
	if err := o.read(strings.NewReader(stream)); err != nil {
		t.Fatal(err)
	}
	want := "imagebuild: datascience: step 1/3 FROM jazzmine-python-base:bookworm (1.0s)\n" +
		"imagebuild: datascience: step 2/3 " + shorten(long, maxStepText) + " (1.0s)\n" +
		"imagebuild: datascience: step 3/3 LABEL a=b (1.0s)\n"
	if progress.String() != want {
		t.Errorf("progress:\n%s\nwant:\n%s", progress.String(), want)
	}
	if got := shorten(long, maxStepText); len(got) != maxStepText || !strings.HasSuffix(got, "...") {
		t.Errorf("a long step is shown as %q, want %d characters ending in ...", got, maxStepText)
	}

	progress.Reset()
	o = &buildOutput{sandbox: "s", b: b, now: c.now}
	if err := o.read(strings.NewReader(`{"stream":"Step 1/1 : RUN false\n"}{"errorDetail":{"message":"returned a non-zero code: 1"}}`)); err == nil {
		t.Fatal("a build's error is not an error")
	}
	if want := "imagebuild: s: step 1/1 RUN false (failed after 1.0s)\n"; progress.String() != want {
		t.Errorf("progress %q, want %q", progress.String(), want)
	}
}
