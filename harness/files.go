package harness

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"

	"github.com/jazzmine/worker/wire"
)

// InputFile is a file the harness writes into the workspace before the script runs.
type InputFile struct {
	// Path is relative to the workspace; the caller has validated it
	// (wire.ValidatePath).
	Path string
	// Mode is the permission bits; zero means 0o644.
	Mode int
	// Size is the number of bytes Open's reader gives.
	Size int64
	// Open returns the content, called when the file is sent: it is streamed, never
	// held whole.
	Open func(ctx context.Context) (io.ReadCloser, error)
}

// inputError is a failure to send an input file: the run ends as input_file, and the
// container, which holds part of the inputs, is not reused.
type inputError struct{ msg string }

func (e *inputError) Error() string { return e.msg }

// sendInputs streams the request's input files to the harness, each as a file line and
// chunk lines of at most ChunkBytes. The harness writes them at its own pace: a write
// blocks while it is behind, so a file is never held whole here.
func (r *run) sendInputs(ctx context.Context) error {
	if len(r.req.Files) == 0 {
		return nil
	}
	buf := make([]byte, ChunkBytes)
	id, _ := json.Marshal(r.req.ExecutionID)
	line := make([]byte, 0, 64+len(id)+base64.StdEncoding.EncodedLen(ChunkBytes))
	for _, f := range r.req.Files {
		if err := r.sendInput(ctx, f, buf, line, id); err != nil {
			return err
		}
	}
	return nil
}

// sendInput sends one input file: its line, then its bytes as chunk lines, each
// encoded into line (whose capacity holds one) with the JSON-quoted execution id.
func (r *run) sendInput(ctx context.Context, f InputFile, buf, line, id []byte) error {
	rc, err := f.Open(ctx)
	if err != nil {
		return &inputError{fmt.Sprintf("input file %s: %v", f.Path, err)}
	}
	defer rc.Close()
	if err := r.c.writeLine(requestFile, fileRequest{Type: requestFile, ExecutionID: r.req.ExecutionID, Path: f.Path, Mode: f.Mode, Size: f.Size}); err != nil {
		return err
	}
	for left := f.Size; left > 0; {
		n, err := io.ReadFull(rc, buf[:min(int64(len(buf)), left)])
		if err != nil {
			return &inputError{fmt.Sprintf("input file %s: reading it after %d of %d bytes: %v", f.Path, f.Size-left, f.Size, err)}
		}
		left -= int64(n)
		line = append(append(append(line[:0], `{"type":"chunk","execution_id":`...), id...), `,"data":"`...)
		line = append(base64.StdEncoding.AppendEncode(line, buf[:n]), "\"}\n"...)
		if err := r.c.writeRaw(requestChunk, line); err != nil {
			return err
		}
	}
	return nil
}

// blob reads the bytes of an artifact or a display image from the chunk lines that
// follow its line: it is the Event's Blob while the EventFunc runs.
type blob struct {
	r    *run
	ctx  context.Context // the execution's deadline
	left int64           // bytes still to come
	buf  []byte          // decoded and not yet read
	err  error           // sticky: why the bytes stopped coming
}

func (b *blob) Read(p []byte) (int, error) {
	for len(b.buf) == 0 {
		if b.err != nil {
			return 0, b.err
		}
		if b.left == 0 {
			return 0, io.EOF
		}
		b.err = b.fill()
	}
	n := copy(p, b.buf)
	b.buf = b.buf[n:]
	return n, nil
}

// errBlobStream is the error of a blob whose chunk lines did not come as announced.
var errBlobStream = errors.New("the harness did not send the announced bytes")

// fill reads the next chunk line.
func (b *blob) fill() error {
	l, err := b.r.c.next(b.ctx)
	if err != nil {
		b.r.blobFailure = err
		return fmt.Errorf("%w: %v", errBlobStream, err)
	}
	var ch struct {
		Type        string `json:"type"`
		ExecutionID string `json:"execution_id"`
		Data        []byte `json:"data"`
	}
	switch {
	case l.oversize:
		err = fmt.Errorf("%w: a chunk line over the line limit", ErrProtocol)
	case json.Unmarshal(l.b, &ch) != nil || ch.Type != EventChunk || ch.ExecutionID != b.r.req.ExecutionID:
		err = fmt.Errorf("%w: a %q line where a chunk was due: %q", ErrProtocol, ch.Type, truncate(l.b, 120))
	case int64(len(ch.Data)) > b.left || len(ch.Data) == 0:
		err = fmt.Errorf("%w: a chunk of %d bytes where %d were left", ErrProtocol, len(ch.Data), b.left)
	}
	if err != nil {
		b.r.blobFailure = err
		return fmt.Errorf("%w: %v", errBlobStream, err)
	}
	b.left -= int64(len(ch.Data))
	b.buf = ch.Data
	return nil
}

// openBlob checks the announced bytes of ev against the artifact limits and sets its
// Blob. The harness checks the limits before it sends anything; going past them here
// means it misbehaved.
func (r *run) openBlob(ctx context.Context, ev *Event) error {
	if ev.Size < 0 {
		return fmt.Errorf("%w: a %s of %d bytes", ErrProtocol, ev.Type, ev.Size)
	}
	if !ev.IsFile() {
		return nil
	}
	// The host makes an object name of the path: the harness sends only clean
	// workspace paths of at most 1,024 bytes, and anything else is its misbehaving.
	if err := wire.ValidatePath(ev.Type+" path", ev.Path); err != nil {
		return fmt.Errorf("%w: %v", ErrProtocol, err)
	}
	r.artifacts++
	r.artifactBytes += ev.Size
	if r.artifacts > r.req.MaxArtifacts || r.artifactBytes > r.req.MaxArtifactBytes {
		return fmt.Errorf("%w: artifacts past the limits the harness was given (%d files, %d bytes)", ErrProtocol, r.artifacts, r.artifactBytes)
	}
	if ev.Size > 0 { // its bytes follow as chunk lines
		ev.Blob = &blob{r: r, ctx: ctx, left: ev.Size}
	}
	return nil
}

// closeBlob reads what the EventFunc left of ev's blob, and reports how the blob's
// stream ended: nil, or the failure that ends the run.
func (r *run) closeBlob(ev *Event) error {
	b, ok := ev.Blob.(*blob)
	if !ok {
		return nil
	}
	if b.err == nil {
		_, _ = io.Copy(io.Discard, b)
	}
	return r.blobFailure
}
