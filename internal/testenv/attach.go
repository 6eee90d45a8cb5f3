package testenv

import (
	"bufio"
	"context"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/moby/moby/api/pkg/stdcopy"
	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/client"

	"github.com/jazzmine/worker/harness"
)

// Attached is a container started with its stdin and stdout attached: R is its
// stdout, demultiplexed as the pool does it, W its stdin.
type Attached struct {
	ID string
	R  io.Reader
	W  io.Writer
}

// RawContainer starts image with cmd, with no network and attached before start, as
// the pool's containers are as far as a benchmark needs. It is removed at cleanup.
func RawContainer(tb testing.TB, image string, cmd []string) *Attached {
	tb.Helper()
	d := Docker(tb)
	ctx := context.Background()
	init := true
	created, err := d.ContainerCreate(ctx, client.ContainerCreateOptions{
		Config: &container.Config{
			Image: image, Entrypoint: cmd[:1], Cmd: cmd[1:],
			OpenStdin: true, StdinOnce: false, AttachStdin: true, AttachStdout: true, AttachStderr: true,
			Labels: map[string]string{harness.LabelManaged: "true", "jazzmine.worker": "bench-raw-" + strings.ReplaceAll(tb.Name(), "/", "-")},
		},
		HostConfig: &container.HostConfig{NetworkMode: "none", LogConfig: container.LogConfig{Type: "none"}, Init: &init},
	})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		_, _ = d.ContainerRemove(context.Background(), created.ID, client.ContainerRemoveOptions{Force: true})
	})
	att, err := d.ContainerAttach(ctx, created.ID, client.ContainerAttachOptions{Stream: true, Stdin: true, Stdout: true, Stderr: true})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(att.Close)
	pr, pw := io.Pipe()
	go func() {
		_, err := stdcopy.StdCopy(pw, io.Discard, att.Reader)
		pw.CloseWithError(err)
	}()
	if _, err := d.ContainerStart(ctx, created.ID, client.ContainerStartOptions{}); err != nil {
		tb.Fatal(err)
	}
	return &Attached{ID: created.ID, R: pr, W: att.Conn}
}

// Floor is the physical floor under every execution: one line written to a
// container's attached stdin and read back from its stdout, through Docker's attach
// stream, with cat at the other end.
type Floor struct {
	raw *Attached
	r   *bufio.Reader
}

// NewFloor starts the floor's container, of image.
func NewFloor(tb testing.TB, image string) *Floor {
	raw := RawContainer(tb, image, []string{"cat"})
	return &Floor{raw: raw, r: bufio.NewReader(raw.R)}
}

// RoundTrip sends one protocol-sized line and returns how long it took to come back.
func (f *Floor) RoundTrip(tb testing.TB) time.Duration {
	t0 := time.Now()
	if _, err := f.raw.W.Write([]byte("{\"type\":\"ping\"}\n")); err != nil {
		tb.Fatal(err)
	}
	if _, err := f.r.ReadBytes('\n'); err != nil {
		tb.Fatal(err)
	}
	return time.Since(t0)
}
