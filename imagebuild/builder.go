package imagebuild

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/containerd/errdefs"
	"github.com/moby/moby/api/types/build"
	"github.com/moby/moby/api/types/jsonstream"
	"github.com/moby/moby/client"
	"golang.org/x/sync/singleflight"
)

// stepLine matches the classic builder's line that starts a step of the
// Dockerfile: "Step 3/7 : RUN apt-get update ...".
var stepLine = regexp.MustCompile(`^Step (\d+/\d+) : (.*)$`)

// maxStepText bounds the instruction a progress line shows: enough for an
// apt-get install line to name its first packages.
const maxStepText = 100

// logTailLines is the number of build log lines a BuildError keeps.
const logTailLines = 50

// BuilderConfig configures a Builder.
type BuilderConfig struct {
	// Docker is the engine to build on (see Connect). Required.
	Docker Docker
	// Logger receives one record per build and per reused image; nil discards.
	Logger *slog.Logger
	// Progress receives a line when a build starts and one for each step of the
	// Dockerfile when it ends, with its time ("imagebuild: <sandbox>: step 3/7
	// RUN apt-get ... (12.3s)"); the step's own output is left out (a failed
	// build's *BuildError holds its end). nil means no progress output. Writes
	// are serialised, one line each.
	Progress io.Writer
}

// Builder ensures that the image of a sandbox exists, building it when its
// checksum has no image yet. It is safe for concurrent use; concurrent callers
// for the same image share one build.
type Builder struct {
	docker   Docker
	log      *slog.Logger
	flights  singleflight.Group
	mu       sync.Mutex // guards progress
	progress io.Writer
}

// Image is a sandbox's image as Ensure found or built it.
type Image struct {
	// Tag is jazzmine-sandbox-<name>:<first 16 hex characters of Checksum>.
	Tag string
	// Checksum is the full checksum (see Checksum), also the image's
	// jazzmine.checksum label.
	Checksum string
	// ID is the image's id ("sha256:...").
	ID string
	// Built is true when this call built the image (or shared the build that did).
	Built bool
}

// BuildError is a failed image build, with the end of its build log.
type BuildError struct {
	// Sandbox is the sandbox's name.
	Sandbox string
	// Tag is the tag the build was to produce.
	Tag string
	// LogTail are the last lines (at most 50) of the build's output.
	LogTail []string
	// Err is the error the engine reported, or why the build could not run.
	Err error
}

// Error returns the sandbox, the tag, the cause and the log tail, one line each.
func (e *BuildError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "build image %s of sandbox %q: %v", e.Tag, e.Sandbox, e.Err)
	if len(e.LogTail) > 0 {
		fmt.Fprintf(&b, "\nlast %d lines of the build log:", len(e.LogTail))
		for _, l := range e.LogTail {
			b.WriteString("\n  ")
			b.WriteString(l)
		}
	}
	return b.String()
}

// Unwrap returns Err.
func (e *BuildError) Unwrap() error { return e.Err }

// NewBuilder returns a Builder. It fails when cfg.Docker is nil.
func NewBuilder(cfg BuilderConfig) (*Builder, error) {
	if cfg.Docker == nil {
		return nil, errors.New("imagebuild: BuilderConfig.Docker is required (see Connect)")
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Builder{docker: cfg.Docker, log: log, progress: cfg.Progress}, nil
}

// Ensure returns the image of spec, building it if no image has its tag yet: an
// unchanged checksum never rebuilds. The base image must exist locally (nothing
// is pulled). A failed build returns a *BuildError.
//
// ctx limits how long the caller waits. A build already under way goes on when
// the caller gives up, so that the next caller finds the image; concurrent
// callers of one tag share a single build.
func (b *Builder) Ensure(ctx context.Context, spec *Spec) (Image, error) {
	base, err := b.docker.ImageInspect(ctx, spec.BaseImage)
	if err != nil {
		if errdefs.IsNotFound(err) && spec.BaseImage == DefaultBaseImage {
			return Image{}, fmt.Errorf("sandbox %q: base image %q not found: build it with \"make base-image\"", spec.Name, spec.BaseImage)
		}
		if errdefs.IsNotFound(err) {
			return Image{}, fmt.Errorf("sandbox %q: base image %q not found: build or load it on this host (images are never pulled)", spec.Name, spec.BaseImage)
		}
		return Image{}, fmt.Errorf("sandbox %q: inspect base image %q: %w", spec.Name, spec.BaseImage, err)
	}
	sum := Checksum(spec, base.ID)
	img := Image{Tag: Tag(spec.Name, sum), Checksum: sum}

	id, err := b.lookup(ctx, img.Tag)
	if err != nil {
		return Image{}, fmt.Errorf("sandbox %q: %w", spec.Name, err)
	}
	if id != "" {
		img.ID = id
		b.log.Debug("sandbox image up to date", "sandbox", spec.Name, "tag", img.Tag)
		return img, nil
	}

	buildCtx := context.WithoutCancel(ctx)
	ch := b.flights.DoChan(img.Tag, func() (any, error) {
		return b.build(buildCtx, spec, img)
	})
	select {
	case <-ctx.Done():
		return Image{}, fmt.Errorf("sandbox %q: wait for the build of %s: %w", spec.Name, img.Tag, ctx.Err())
	case res := <-ch:
		if res.Err != nil {
			return Image{}, res.Err
		}
		return res.Val.(Image), nil
	}
}

// EnsureAll ensures the image of every sandbox of cfg, one after another in name
// order. It returns the images it has, by sandbox name, and every error, joined.
func (b *Builder) EnsureAll(ctx context.Context, cfg *Config) (map[string]Image, error) {
	images := map[string]Image{}
	var errs []error
	for _, name := range cfg.Names() {
		if err := ctx.Err(); err != nil {
			errs = append(errs, err)
			break
		}
		img, err := b.Ensure(ctx, cfg.Sandboxes[name])
		if err != nil {
			errs = append(errs, err)
			continue
		}
		images[name] = img
	}
	return images, errors.Join(errs...)
}

// lookup returns the id of the image tagged tag, or "" if there is none.
func (b *Builder) lookup(ctx context.Context, tag string) (string, error) {
	res, err := b.docker.ImageInspect(ctx, tag)
	if errdefs.IsNotFound(err) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("inspect image %s: %w", tag, err)
	}
	return res.ID, nil
}

// build runs one image build; it is the function of a flight.
func (b *Builder) build(ctx context.Context, spec *Spec, img Image) (Image, error) {
	// A build of this tag may have finished between the caller's lookup and
	// this flight.
	if id, err := b.lookup(ctx, img.Tag); err != nil {
		return Image{}, fmt.Errorf("sandbox %q: %w", spec.Name, err)
	} else if id != "" {
		img.ID = id
		return img, nil
	}
	fail := func(tail []string, err error) (Image, error) {
		return Image{}, &BuildError{Sandbox: spec.Name, Tag: img.Tag, LogTail: tail, Err: err}
	}
	tarball, err := buildContext(spec, img.Checksum)
	if err != nil {
		return fail(nil, err)
	}
	b.log.Info("building sandbox image", "sandbox", spec.Name, "tag", img.Tag, "context_bytes", len(tarball))
	b.progressf("imagebuild: %s: building %s\n", spec.Name, img.Tag)
	start := time.Now()
	id, tail, err := b.runBuild(ctx, spec.Name, img.Tag, tarball)
	if err != nil {
		return fail(tail, err)
	}
	img.ID, img.Built = id, true
	b.log.Info("built sandbox image", "sandbox", spec.Name, "tag", img.Tag, "id", id,
		"duration", time.Since(start).Round(time.Millisecond))
	return img, nil
}

// runBuild builds the tarball (a build context with a Dockerfile) as tag with the
// classic builder, writing progress under the name. It returns the image id, or the
// error with the tail of the build log.
func (b *Builder) runBuild(ctx context.Context, name, tag string, tarball []byte) (string, []string, error) {
	res, err := b.docker.ImageBuild(ctx, bytes.NewReader(tarball), client.ImageBuildOptions{
		Tags:        []string{tag},
		Dockerfile:  "Dockerfile",
		Remove:      true,
		ForceRemove: true,
		PullParent:  false,
		Version:     build.BuilderV1,
	})
	if err != nil {
		return "", nil, err
	}
	out := &buildOutput{sandbox: name, b: b, now: time.Now}
	err = out.read(res.Body)
	_ = res.Body.Close()
	if err != nil {
		return "", out.tail, err
	}
	id, err := b.lookup(ctx, tag)
	if err == nil && id == "" {
		err = errors.New("the build ended without an image of that tag")
	}
	return id, out.tail, err
}

// buildOutput reads a build's JSON message stream: it keeps the last lines of the
// log and writes a progress line when a step ends.
type buildOutput struct {
	sandbox string
	b       *Builder
	now     func() time.Time
	partial string // an unterminated line, waiting for the rest
	tail    []string
	step    string    // the step under way, "3/7 RUN ...", or ""
	began   time.Time // when it began
}

// buildMessage is one message of the stream; old engines also send the error as
// a plain "error" string.
type buildMessage struct {
	jsonstream.Message
	ErrorText string `json:"error,omitempty"`
}

// read consumes the stream; it returns the build's error, if it reports one.
func (o *buildOutput) read(r io.Reader) error {
	dec := json.NewDecoder(r)
	for {
		var m buildMessage
		if err := dec.Decode(&m); err != nil {
			o.flush()
			if errors.Is(err, io.EOF) {
				o.endStep("")
				return nil
			}
			o.endStep("failed after ")
			return fmt.Errorf("read the build output: %w", err)
		}
		if m.Error != nil || m.ErrorText != "" {
			o.flush()
			msg := m.ErrorText
			if m.Error != nil && m.Error.Message != "" {
				msg = m.Error.Message
			}
			o.line("ERROR: " + msg)
			o.endStep("failed after ")
			return errors.New(strings.TrimSpace(msg))
		}
		switch {
		case m.Stream != "":
			o.write(m.Stream)
		case m.Status != "" && m.Progress == nil:
			o.flush()
			o.line(strings.TrimSpace(m.ID + " " + m.Status))
		}
	}
}

// write adds stream text, which need not end at a line's end.
func (o *buildOutput) write(s string) {
	s = o.partial + strings.ReplaceAll(s, "\r", "\n")
	lines := strings.Split(s, "\n")
	o.partial = lines[len(lines)-1]
	for _, l := range lines[:len(lines)-1] {
		o.line(l)
	}
}

func (o *buildOutput) flush() {
	if o.partial != "" {
		o.line(o.partial)
		o.partial = ""
	}
}

// line records one complete line of output; a step's first line ends the step
// before it.
func (o *buildOutput) line(l string) {
	l = strings.TrimRight(l, " \t")
	if strings.TrimSpace(l) == "" {
		return
	}
	if len(o.tail) == logTailLines {
		copy(o.tail, o.tail[1:])
		o.tail = o.tail[:logTailLines-1]
	}
	o.tail = append(o.tail, l)
	if m := stepLine.FindStringSubmatch(l); m != nil {
		o.endStep("")
		o.step, o.began = m[1]+" "+shorten(m[2], maxStepText), o.now()
	}
}

// endStep writes the progress line of the step under way, if there is one:
// "imagebuild: <sandbox>: step 3/7 RUN ... (<how>12.3s)".
func (o *buildOutput) endStep(how string) {
	if o.step == "" {
		return
	}
	o.b.progressf("imagebuild: %s: step %s (%s%.1fs)\n", o.sandbox, o.step, how, o.now().Sub(o.began).Seconds())
	o.step = ""
}

// progressf writes one progress line, if the builder has a Progress writer.
func (b *Builder) progressf(format string, args ...any) {
	if b.progress == nil {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	fmt.Fprintf(b.progress, format, args...)
}

// shorten is s with its runs of white space made one space, cut to max runes
// with "..." at the end when it is longer.
func shorten(s string, max int) string {
	s = strings.Join(strings.Fields(s), " ")
	if r := []rune(s); len(r) > max {
		return string(r[:max-3]) + "..."
	}
	return s
}
