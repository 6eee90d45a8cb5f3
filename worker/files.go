package worker

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"slices"
	"sync"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jazzmine/worker/harness"
	"github.com/jazzmine/worker/wire"
)

// files is the worker's side of the files contract: it reads a job's input files
// from the object store bucket wire.FilesBucket (or the job itself) and stores the
// artifacts and display images of an execution there, or, for a tenant's execution,
// in the tenant's own bucket (wire.TenantFilesBucket), each streamed, never whole in
// memory.
type files struct {
	js        jetstream.JetStream
	store     jetstream.ObjectStore       // wire.FilesBucket, set by ensureStreams
	tenantCfg jetstream.ObjectStoreConfig // of a tenant's bucket but its name, set by ensureStreams
	bg        *background                 // where tenants' chunk requests are served

	mu      sync.Mutex
	tenants map[string]*tenantBucket // the tenants' buckets this worker has made or looked up (tenantfiles.go)
	rates   *tenantRates             // each tenant's chunk requests
}

// errInputFile is the failure of a job whose input files cannot be given to it: an
// object that is missing, or more bytes than the sandbox's workspace holds.
type errInputFile struct{ msg string }

func (e *errInputFile) Error() string { return e.msg }

// inputs returns the job's input files for the harness, each opened when it is sent.
// Objects are looked up now, before a container is taken: a missing one, or files
// larger than limit added up (when limit > 0), is an *errInputFile. A tenant's job
// names objects of its own bucket only (its executions' artifacts): the names are
// looked up there, never in another's.
func (f *files) inputs(ctx context.Context, ref execRef, job *wire.Job, limit int64) ([]harness.InputFile, error) {
	if len(job.Files) == 0 {
		return nil, nil
	}
	out := make([]harness.InputFile, 0, len(job.Files))
	var total int64
	store, bucket := f.store, wire.FilesBucket
	if ref.tenant != "" && slices.ContainsFunc(job.Files, func(jf wire.File) bool { return jf.Object != "" }) {
		b, err := f.tenantBucket(ctx, ref.tenant, false) // a read: it makes no bucket
		switch {
		case errors.Is(err, jetstream.ErrBucketNotFound) || errors.Is(err, jetstream.ErrStreamNotFound):
			return nil, &errInputFile{fmt.Sprintf("input files name objects, and the bucket %s holds none yet", wire.TenantFilesBucket(ref.tenant))}
		case err != nil:
			return nil, fmt.Errorf("input files: %w", err)
		}
		store, bucket = b.store, b.name
	}
	for _, jf := range job.Files {
		in := harness.InputFile{Path: jf.Path, Mode: jf.Mode, Size: int64(len(jf.Data))}
		if jf.Object == "" {
			data := jf.Data
			in.Open = func(context.Context) (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(data)), nil }
		} else {
			info, err := store.GetInfo(ctx, jf.Object)
			if errors.Is(err, jetstream.ErrObjectNotFound) {
				return nil, &errInputFile{fmt.Sprintf("input file %s: object %q is not in the bucket %s", jf.Path, jf.Object, bucket)}
			}
			if err != nil {
				return nil, fmt.Errorf("input file %s: look up object %q: %w", jf.Path, jf.Object, err)
			}
			in.Size = int64(info.Size)
			in.Open = func(ctx context.Context) (io.ReadCloser, error) { return f.open(ctx, bucket, info) }
		}
		total += in.Size
		out = append(out, in)
	}
	if limit > 0 && total > limit {
		return nil, &errInputFile{fmt.Sprintf("input files are %d bytes in all, more than the workspace of this sandbox holds (%d bytes)", total, limit)}
	}
	return out, nil
}

// put stores the file of an artifact event, or the image of a display event, of
// attempt attempt of execution ref in its tenant's bucket, and fills ev with the
// bucket, the object's name, size, SHA-256 and content type. Other events, and a
// display without an image, have nothing to store. A tenant's bucket at its bound
// gives an *errBucketFull.
func (f *files) put(ctx context.Context, ref execRef, attempt int, hev harness.Event, ev *wire.Event) error {
	if !hev.IsFile() {
		return nil
	}
	store := f.store
	var b *tenantBucket
	if ref.tenant != "" {
		var err error
		if b, err = f.tenantBucket(ctx, ref.tenant, true); err != nil {
			return fmt.Errorf("store %s %s: %w", hev.Type, hev.Path, err)
		}
		store = b.store
	}
	key := ref.key()
	name := wire.ArtifactObject(key, attempt, hev.Path)
	if hev.Type == wire.EventDisplay {
		name = wire.ObjectPrefix(key, attempt) + hev.Path // display/<n>.<ext>, named by the harness
	}
	body := hev.Blob
	if body == nil {
		body = bytes.NewReader(nil)
	}
	sum := sha256.New()
	meta := jetstream.ObjectMeta{Name: name}
	if hev.ContentType != "" {
		meta.Headers = nats.Header{"Content-Type": []string{hev.ContentType}}
	}
	info, err := store.Put(ctx, meta, io.TeeReader(body, sum))
	if err != nil {
		err = fmt.Errorf("store %s %s: %w", hev.Type, hev.Path, err)
		if b != nil {
			err = f.putFailed(ref.tenant, b, err)
		}
		return err
	}
	ev.Path, ev.Bucket, ev.Object, ev.Size, ev.ContentType = hev.Path, info.Bucket, info.Name, int64(info.Size), hev.ContentType
	ev.SHA256 = hex.EncodeToString(sum.Sum(nil))
	return nil
}

// objectChunksAhead is how many chunks of an object (128 KiB each by default) a read
// asks the server for ahead of the container: what the worker holds of a file.
const objectChunksAhead = 4

// open reads the chunks of the object of bucket that info describes (the bucket the
// worker looked it up in, not the one its description names) with an ordered pull consumer,
// objectChunksAhead at a time, checking their SHA-256 at the end. Not the library's
// ObjectStore.Get: its push consumer sends the object at the server's pace, not the
// reader's, and the worker held 60 MB of a 100 MB file that streamed into a
// container.
func (f *files) open(ctx context.Context, bucket string, info *jetstream.ObjectInfo) (io.ReadCloser, error) {
	cons, err := f.js.OrderedConsumer(ctx, "OBJ_"+bucket, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{"$O." + bucket + ".C." + info.NUID},
	})
	if err != nil {
		return nil, fmt.Errorf("read object %q: %w", info.Name, err)
	}
	it, err := cons.Messages(jetstream.PullMaxMessages(objectChunksAhead))
	if err != nil {
		return nil, fmt.Errorf("read object %q: %w", info.Name, err)
	}
	return &objectReader{ctx: ctx, info: info, it: it, left: int64(info.Size), sum: sha256.New()}, nil
}

// objectReader is an object's bytes, read chunk by chunk.
type objectReader struct {
	ctx  context.Context // the execution's deadline: a chunk deleted meanwhile never comes
	info *jetstream.ObjectInfo
	it   jetstream.MessagesContext
	buf  []byte
	left int64
	sum  hash.Hash
}

func (r *objectReader) Read(p []byte) (int, error) {
	for len(r.buf) == 0 {
		if r.left == 0 {
			return 0, io.EOF
		}
		msg, err := r.it.Next(jetstream.NextContext(r.ctx))
		if err != nil {
			return 0, fmt.Errorf("object %q: %w", r.info.Name, err)
		}
		r.buf = msg.Data()
		if int64(len(r.buf)) > r.left {
			return 0, fmt.Errorf("object %q: more bytes than its size, %d", r.info.Name, r.info.Size)
		}
		r.left -= int64(len(r.buf))
		r.sum.Write(r.buf)
		// Checked before the last bytes are given: a reader takes exactly the size.
		if r.left == 0 && r.info.Digest != jetstream.GetObjectDigestValue(r.sum) {
			return 0, fmt.Errorf("object %q: its bytes do not hash to its digest %s", r.info.Name, r.info.Digest)
		}
	}
	n := copy(p, r.buf)
	r.buf = r.buf[n:]
	return n, nil
}

func (r *objectReader) Close() error {
	r.it.Stop()
	return nil
}
