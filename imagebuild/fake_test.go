package imagebuild

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"sync"

	"github.com/containerd/errdefs"
	"github.com/moby/moby/api/types/image"
	"github.com/moby/moby/api/types/jsonstream"
	"github.com/moby/moby/client"
)

// fakeDocker is an engine with images by reference and builds that a test
// scripts: a build writes its messages and, unless it fails, tags the image.
type fakeDocker struct {
	mu       sync.Mutex
	images   map[string]string // reference -> id
	builds   []fakeBuild
	inspects map[string]int // reference -> number of inspections

	// onBuild, if set, runs at the start of each build (outside the lock).
	onBuild func(ctx context.Context)
	// messages are the build's JSON messages; fail ends the stream with an error.
	messages []jsonstream.Message
	fail     string
	// buildErr is returned by ImageBuild itself.
	buildErr error
}

// fakeBuild is what one ImageBuild call received.
type fakeBuild struct {
	options client.ImageBuildOptions
	files   map[string][]byte
	modes   map[string]int64
}

func newFakeDocker() *fakeDocker {
	return &fakeDocker{
		images:   map[string]string{DefaultBaseImage: "sha256:base"},
		inspects: map[string]int{},
	}
}

func (f *fakeDocker) ImageInspect(_ context.Context, ref string, _ ...client.ImageInspectOption) (client.ImageInspectResult, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.inspects[ref]++
	id, ok := f.images[ref]
	if !ok {
		return client.ImageInspectResult{}, fmt.Errorf("Error: No such image: %s: %w", ref, errdefs.ErrNotFound)
	}
	return client.ImageInspectResult{InspectResponse: image.InspectResponse{ID: id}}, nil
}

func (f *fakeDocker) ImageBuild(ctx context.Context, r io.Reader, opts client.ImageBuildOptions) (client.ImageBuildResult, error) {
	files, modes, err := readTar(r)
	if err != nil {
		return client.ImageBuildResult{}, err
	}
	if f.onBuild != nil {
		f.onBuild(ctx)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.builds = append(f.builds, fakeBuild{options: opts, files: files, modes: modes})
	if f.buildErr != nil {
		return client.ImageBuildResult{}, f.buildErr
	}
	var body bytes.Buffer
	enc := json.NewEncoder(&body)
	for _, m := range f.messages {
		_ = enc.Encode(m)
	}
	if f.fail != "" {
		_ = enc.Encode(jsonstream.Message{Error: &jsonstream.Error{Code: 1, Message: f.fail}})
	} else {
		id := fmt.Sprintf("sha256:built%d", len(f.builds))
		_ = enc.Encode(jsonstream.Message{Stream: "Successfully built " + id + "\n"})
		for _, tag := range opts.Tags {
			f.images[tag] = id
		}
	}
	return client.ImageBuildResult{Body: io.NopCloser(&body)}, nil
}

func (f *fakeDocker) buildCount() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.builds)
}

func (f *fakeDocker) inspections(ref string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.inspects[ref]
}

func readTar(r io.Reader) (map[string][]byte, map[string]int64, error) {
	files, modes := map[string][]byte{}, map[string]int64{}
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return files, modes, nil
		}
		if err != nil {
			return nil, nil, fmt.Errorf("build context: %w", err)
		}
		data, err := io.ReadAll(tr)
		if err != nil {
			return nil, nil, err
		}
		name := strings.TrimSuffix(h.Name, "/")
		files[name], modes[name] = data, h.Mode
	}
}
