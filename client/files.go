package client

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jazzmine/worker/wire"
)

// InlineLimit is the largest file [Client.InputFile] puts in the job itself;
// a larger one is uploaded to the object store bucket [wire.FilesBucket] and
// named by reference.
const InlineLimit = 64 << 10

// Artifact is a file an execution left in its workspace (an artifact event),
// or the image of a display event: stored in an object store bucket as
// Object; [Client.Download] reads it.
type Artifact struct {
	// Path is where the file was, relative to the workspace ("out/chart.png",
	// "display/1.png").
	Path string
	// Bucket is the object store bucket that holds it: [wire.FilesBucket],
	// or, for an agent of a tenant, the tenant's [wire.TenantFilesBucket] in
	// the fleet's account.
	Bucket string
	// Object is the name of its object in Bucket.
	Object string
	// Size is its size in bytes and SHA256 its SHA-256, in hex.
	Size   int64
	SHA256 string
	// ContentType is its MIME type, as the sandbox guessed it from its name.
	ContentType string
}

// Display is what a script displayed (display(obj), a matplotlib figure).
type Display struct {
	// Data maps MIME types to the text forms of the object: "text/plain"
	// always, and "text/html", "text/markdown" when it has them.
	Data map[string]string
	// Image is its image, PNG, JPEG or SVG, when it has one.
	Image *Artifact
}

// Input is the input file of a later job that holds a's content, written at path in
// its workspace: an execution's artifact read by the next without a download and an
// upload.
func (a *Artifact) Input(path string) wire.File {
	return wire.File{Path: path, Object: a.Object, Bucket: a.Bucket}
}

func artifactOf(ev *wire.Event) *Artifact {
	bucket := ev.Bucket
	if bucket == "" {
		bucket = wire.FilesBucket // a worker from before buckets were named
	}
	return &Artifact{Path: ev.Path, Bucket: bucket, Object: ev.Object, Size: ev.Size, SHA256: ev.SHA256, ContentType: ev.ContentType}
}

func displayOf(ev *wire.Event) Display {
	d := Display{Data: map[string]string{}}
	if m, ok := ev.Data.(map[string]any); ok {
		for k, v := range m {
			if s, ok := v.(string); ok {
				d.Data[k] = s
			}
		}
	}
	if ev.Object != "" {
		d.Image = artifactOf(ev)
	}
	return d
}

// Uploads: the bucket of files an agent puts, in its own account.
const (
	// uploadsTTL is how long an upload stays in a bucket a client creates: the
	// workers' events' max age, as in theirs.
	uploadsTTL = time.Hour
	// uploadsMaxBytes bounds a bucket a client creates: four workspaces of the
	// default size, and three replicas of it take 768 MiB of a tenant's account's
	// 2 GiB (deploy/nats/auth.conf), which leaves its events room. A stream's
	// MaxBytes is reserved for each replica: at 1 GiB, three would not fit, and
	// the bucket would quietly have one.
	uploadsMaxBytes = 256 << 20
)

// files returns the object store bucket of files, [wire.FilesBucket] of the
// client's account, looked up once. With create, a bucket the account does not
// have is created (a tenant's first upload: the workers make the fleet's own),
// with a one-hour TTL, at most 256 MiB, three replicas on a cluster of three
// servers or more, else one; create it beforehand for other limits.
func (c *Client) files(ctx context.Context, create bool) (jetstream.ObjectStore, error) {
	c.filesMu.Lock()
	defer c.filesMu.Unlock()
	if c.filesStore != nil {
		return c.filesStore, nil
	}
	store, err := c.js.ObjectStore(ctx, wire.FilesBucket)
	if create && (errors.Is(err, jetstream.ErrBucketNotFound) || errors.Is(err, jetstream.ErrStreamNotFound)) {
		cfg := jetstream.ObjectStoreConfig{
			Bucket:      wire.FilesBucket,
			Description: "jazzmine input files an agent uploaded; they expire with the events",
			TTL:         uploadsTTL,
			MaxBytes:    uploadsMaxBytes,
			Storage:     jetstream.FileStorage,
		}
		err = createReplicated(func(replicas int) error {
			cfg.Replicas = replicas
			store, err = c.js.CreateObjectStore(ctx, cfg)
			return err
		})
		if errors.Is(err, jetstream.ErrBucketExists) || errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
			store, err = c.js.ObjectStore(ctx, wire.FilesBucket) // another client, or a worker, was first
		}
	}
	if errors.Is(err, jetstream.ErrBucketNotFound) || errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil, errorf(ErrNoStream, "object store bucket %s not found: is a jazzmine worker running against this NATS server? (%w)", wire.FilesBucket, err)
	}
	if err != nil {
		return nil, fmt.Errorf("object store bucket %s: %w", wire.FilesBucket, err)
	}
	c.filesStore = store
	return store, nil
}

// PutFile streams r into the object store bucket [wire.FilesBucket] of the
// client's account as object name, for a job to name in a [wire.File]'s Object
// with Bucket wire.FilesBucket ([Client.InputFile] makes such a file). The
// object expires with the bucket's TTL (the events' max age, one hour by
// default). An agent of a tenant puts it in its own account's bucket, which
// the first upload creates, and its jobs alone read it.
func (c *Client) PutFile(ctx context.Context, name string, r io.Reader) error {
	store, err := c.files(ctx, true)
	if err != nil {
		return err
	}
	if _, err := store.Put(ctx, jetstream.ObjectMeta{Name: name}, r); err != nil {
		return fmt.Errorf("put object %q: %w", name, err)
	}
	return nil
}

// DeleteFile deletes object name from [wire.FilesBucket] of the client's
// account: an upload whose job has ended, or an artifact once downloaded (of
// the fleet's own account; a tenant's artifacts expire). A name that is not
// there is not an error.
func (c *Client) DeleteFile(ctx context.Context, name string) error {
	store, err := c.files(ctx, false)
	if err != nil {
		return err
	}
	if err := store.Delete(ctx, name); err != nil && !errors.Is(err, jetstream.ErrObjectNotFound) {
		return fmt.Errorf("delete object %q: %w", name, err)
	}
	return nil
}

// InputFile makes the input file of a job from the local file at local, to be
// written at path in the workspace (its base name when path is empty), with
// the local file's permission bits. A file up to [InlineLimit] goes in the
// job; a larger one is streamed into [wire.FilesBucket] under a new name.
func (c *Client) InputFile(ctx context.Context, local, path string) (wire.File, error) {
	if path == "" {
		path = filepath.Base(local)
	}
	f, err := os.Open(local)
	if err != nil {
		return wire.File{}, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return wire.File{}, err
	}
	if !st.Mode().IsRegular() {
		return wire.File{}, fmt.Errorf("input file %s is not a regular file", local)
	}
	file := wire.File{Path: path, Mode: int(st.Mode().Perm())}
	if st.Size() <= InlineLimit {
		file.Data, err = io.ReadAll(f)
		return file, err
	}
	file.Object, file.Bucket = "uploads/"+NewExecutionID()+"/"+filepath.Base(local), wire.FilesBucket
	return file, c.PutFile(ctx, file.Object, f)
}

// Download streams the object of an artifact or a display image into w,
// and checks its size and SHA-256 against a's.
func (c *Client) Download(ctx context.Context, a *Artifact, w io.Writer) error {
	h := sha256.New()
	var n int64
	var err error
	if a.Bucket == "" || a.Bucket == wire.FilesBucket {
		n, err = c.download(ctx, a, io.MultiWriter(w, h))
	} else {
		n, err = c.downloadChunks(ctx, a, io.MultiWriter(w, h))
	}
	if err != nil {
		return err
	}
	if sum := hex.EncodeToString(h.Sum(nil)); n != a.Size || sum != a.SHA256 {
		return fmt.Errorf("object %q is %d bytes with SHA-256 %s, not the %d bytes and %s its event announced", a.Object, n, sum, a.Size, a.SHA256)
	}
	return nil
}

// download copies object a of wire.FilesBucket, in the client's own account, to w.
func (c *Client) download(ctx context.Context, a *Artifact, w io.Writer) (int64, error) {
	store, err := c.files(ctx, false)
	if err != nil {
		return 0, err
	}
	obj, err := store.Get(ctx, a.Object)
	if err != nil {
		return 0, fmt.Errorf("get object %q: %w", a.Object, err)
	}
	defer obj.Close()
	n, err := io.Copy(w, obj)
	if err != nil {
		return n, fmt.Errorf("read object %q: %w", a.Object, err)
	}
	return n, nil
}

// askWait bounds the wait for one answer to a tenant's request to the workers (a
// chunk, the catalog): past the imports' response_threshold (10 s,
// deploy/nats/auth.conf) none can come. askBudget bounds the time one request may
// take in all, asked again while the workers say busy (after 50 ms, doubling to a
// second, with jitter) or do not answer.
const (
	askWait   = 10 * time.Second
	askBudget = 2 * time.Minute
)

// downloadChunks copies object a of a tenant's bucket, in the fleet's account, to w,
// one chunk a request to the workers on wire.SubjectFiles: all that a tenant's
// account may ask of the fleet for its files (deploy/nats/auth.conf).
func (c *Client) downloadChunks(ctx context.Context, a *Artifact, w io.Writer) (int64, error) {
	var n int64
	req := wire.ChunkRequest{Object: a.Object}
	for {
		m, err := c.chunk(ctx, &req)
		switch {
		case errors.Is(err, nats.ErrNoResponders):
			return n, errorf(ErrNoStream, "object %q of bucket %s: nothing answers on %s: is this a tenant's account of a jazzmine fleet? (%w)", a.Object, a.Bucket, wire.SubjectFiles, err)
		case err != nil:
			return n, fmt.Errorf("read object %q of bucket %s: %w", a.Object, a.Bucket, err)
		case m.Header.Get(wire.HeaderError) != "":
			return n, fmt.Errorf("read object %q of bucket %s: %s", a.Object, a.Bucket, m.Header.Get(wire.HeaderError))
		}
		size, err := strconv.ParseInt(m.Header.Get(wire.HeaderObjectSize), 10, 64)
		if err != nil || n+int64(len(m.Data)) > size {
			return n, fmt.Errorf("read object %q: a chunk of %d bytes after %d, for an object of %q bytes", a.Object, len(m.Data), n, m.Header.Get(wire.HeaderObjectSize))
		}
		if _, err := w.Write(m.Data); err != nil {
			return n, err
		}
		n += int64(len(m.Data))
		if n == size {
			return n, nil
		}
		next, err := strconv.ParseUint(m.Header.Get(wire.HeaderNextChunk), 10, 64)
		if err != nil || len(m.Data) == 0 || next <= req.From {
			return n, fmt.Errorf("read object %q: no progress after %d of its %d bytes", a.Object, n, size)
		}
		req.From = next
	}
}

// chunk asks the workers for the chunk req names.
func (c *Client) chunk(ctx context.Context, req *wire.ChunkRequest) (*nats.Msg, error) {
	body, err := json.Marshal(req)
	if err != nil {
		return nil, err
	}
	return c.ask(ctx, wire.SubjectFiles, body)
}

// ask sends a tenant's request to the workers on subject, again while they say busy
// or do not answer, within askBudget.
func (c *Client) ask(ctx context.Context, subject string, body []byte) (*nats.Msg, error) {
	pause, until := 50*time.Millisecond, time.Now().Add(askBudget)
	for {
		rctx, cancel := context.WithTimeout(ctx, askWait)
		m, err := c.nc.RequestWithContext(rctx, subject, body)
		cancel()
		again := err == nil && m.Header.Get(wire.HeaderError) == wire.Busy ||
			errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil
		if !again {
			return m, err
		}
		if time.Now().After(until) {
			if err == nil {
				err = errors.New(wire.Busy)
			}
			return nil, fmt.Errorf("the workers answered nothing on %s within %v: %w", subject, askBudget, err)
		}
		select {
		case <-time.After(pause/2 + mrand.N(pause/2)):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		pause = min(2*pause, time.Second)
	}
}

// Save downloads the object of a into dir, at its workspace path, creating
// the directories it needs, and returns the file's path. The path is checked
// to stay inside dir.
func (c *Client) Save(ctx context.Context, a *Artifact, dir string) (string, error) {
	if err := wire.ValidatePath("artifact path", a.Path); err != nil {
		return "", err
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		return "", err
	}
	defer root.Close()
	if d := filepath.Dir(a.Path); d != "." {
		if err := root.MkdirAll(d, 0o755); err != nil {
			return "", err
		}
	}
	f, err := root.Create(a.Path)
	if err != nil {
		return "", err
	}
	err = c.Download(ctx, a, f)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return filepath.Join(dir, a.Path), err
}
