package worker

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"strconv"
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
	store     jetstream.ObjectStore       // wire.FilesBucket
	tenantCfg jetstream.ObjectStoreConfig // of a tenant's bucket but its name
	bg        *background                 // where tenants' chunk requests are served

	mu      sync.Mutex
	tenants map[string]*tenantBucket // the tenants' buckets this worker has made or looked up (tenantBucket)
	rates   *tenantRates             // each tenant's chunk requests
}

// errInputFile is the failure of a job whose input files cannot be given to it: an
// object that is missing, or more bytes than the sandbox's workspace holds.
type errInputFile struct{ msg string }

func (e *errInputFile) Error() string { return e.msg }

// inputs returns the job's input files for the harness, each opened when it is sent.
// Objects are looked up now, before a container is taken: a missing one, or files
// larger than limit added up (when limit > 0), is an *errInputFile. A tenant's job
// names objects of its own only, never another's: its executions' artifacts, in its
// bucket of the fleet's account, or its uploads, in its own account's (Bucket
// wire.FilesBucket, read through the import of that account's).
func (f *files) inputs(ctx context.Context, ref execRef, job *wire.Job, limit int64) ([]harness.InputFile, error) {
	if len(job.Files) == 0 {
		return nil, nil
	}
	out := make([]harness.InputFile, 0, len(job.Files))
	var total int64
	sources := map[string]*objectSource{} // by the bucket the job names
	for _, jf := range job.Files {
		in := harness.InputFile{Path: jf.Path, Mode: jf.Mode, Size: int64(len(jf.Data))}
		if jf.Object == "" {
			data := jf.Data
			in.Open = func(context.Context) (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(data)), nil }
		} else {
			src, ok := sources[jf.Bucket]
			if !ok {
				var err error
				if src, err = f.source(ctx, ref, jf.Bucket); err != nil {
					return nil, err
				}
				sources[jf.Bucket] = src
			}
			info, err := src.store.GetInfo(ctx, jf.Object)
			switch {
			case errors.Is(err, jetstream.ErrObjectNotFound):
				return nil, &errInputFile{fmt.Sprintf("input file %s: object %q is not in %s", jf.Path, jf.Object, src.what)}
			case err != nil:
				return nil, src.failed(fmt.Errorf("input file %s: look up object %q: %w", jf.Path, jf.Object, err))
			}
			// A description written by hand: no sum of sizes may wrap, and its chunks
			// are read on a subject of its NUID, which no wildcard may widen to the
			// whole bucket (each read would walk every message of the tenant's bucket
			// in the server's loop of the worker's connection).
			switch {
			case info.Size > maxObjectSize:
				return nil, &errInputFile{fmt.Sprintf("input file %s: object %q claims %d bytes", jf.Path, jf.Object, info.Size)}
			case info.Size > 0 && !isNUID(info.NUID):
				return nil, &errInputFile{fmt.Sprintf("input file %s: object %q names its chunks %q, not a NUID", jf.Path, jf.Object, info.NUID)}
			}
			in.Size = int64(info.Size)
			in.Open = func(ctx context.Context) (io.ReadCloser, error) { return src.open(ctx, info) }
		}
		total += in.Size
		out = append(out, in)
	}
	if limit > 0 && total > limit {
		return nil, &errInputFile{fmt.Sprintf("input files are %d bytes in all, more than the workspace of this sandbox holds (%d bytes)", total, limit)}
	}
	return out, nil
}

// maxObjectSize bounds the size an object's description may claim (1 PiB): far
// past any workspace, and no sum of a job's files' sizes wraps.
const maxObjectSize = 1 << 50

// isNUID says whether s is a NUID as the object store names an object's chunks: 22
// letters and digits.
func isNUID(s string) bool {
	if len(s) != 22 {
		return false
	}
	for _, c := range []byte(s) {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z') {
			return false
		}
	}
	return true
}

// objectSource is a bucket a job's input files name objects of.
type objectSource struct {
	what    string                // the bucket, as an error names it to the job's agent
	store   jetstream.ObjectStore // the objects' descriptions
	tenants bool                  // in a tenant's own account, whatever the tenant made of it
	open    func(ctx context.Context, info *jetstream.ObjectInfo) (io.ReadCloser, error)
}

// failed is the error of a look-up in s that failed with err. A tenant's own bucket is
// what the tenant made it (it may have deleted it, or made it another way): its
// failures are the job's input_file error, not the fleet's to retry, but for no answer
// in time.
func (s *objectSource) failed(err error) error {
	if !s.tenants || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout) {
		return err
	}
	return &errInputFile{err.Error()}
}

// source returns the bucket whose objects a file of ref's job names with bucket: for
// the fleet's own account, wire.FilesBucket (or ""); for a tenant's, its artifacts'
// bucket wire.TenantFilesBucket (or "") or its uploads, wire.FilesBucket of its
// own account. Any other is the job's input_file error.
func (f *files) source(ctx context.Context, ref execRef, bucket string) (*objectSource, error) {
	if ref.tenant == "" {
		if bucket != "" && bucket != wire.FilesBucket {
			return nil, &errInputFile{fmt.Sprintf("input files name objects of the bucket %q; a job names objects of %s", bucket, wire.FilesBucket)}
		}
		return &objectSource{what: "the bucket " + wire.FilesBucket, store: f.store, open: f.opener(wire.FilesBucket)}, nil
	}
	switch artifacts := wire.TenantFilesBucket(ref.tenant); bucket {
	case wire.FilesBucket:
		return f.uploads(ctx, ref.tenant)
	case "", artifacts:
		b, err := f.tenantBucket(ctx, ref.tenant, false) // a read: it makes no bucket
		switch {
		case errors.Is(err, jetstream.ErrBucketNotFound) || errors.Is(err, jetstream.ErrStreamNotFound):
			return nil, &errInputFile{fmt.Sprintf("input files name artifacts, and the bucket %s holds none yet", artifacts)}
		case err != nil:
			return nil, fmt.Errorf("input files: %w", err)
		}
		return &objectSource{what: "the bucket " + artifacts, store: b.store, open: f.opener(artifacts)}, nil
	default:
		return nil, &errInputFile{fmt.Sprintf("input files name objects of the bucket %q; a tenant's job names its artifacts (%s) or its uploads (%s of its own account)", bucket, artifacts, wire.FilesBucket)}
	}
}

// uploadsPrefix is the JetStream API prefix under which the fleet's account reaches
// a tenant's account, jazzmine.uploads.<tenant>: its uploads bucket's stream info and
// direct gets, one message a request, and nothing else (deploy/nats/auth.conf).
const uploadsPrefix = "jazzmine.uploads."

// uploads returns the bucket of tenant's uploads, wire.FilesBucket in its own account,
// whose objects' descriptions and chunks are the tenant's to write: the reader checks
// each object's size and digest, and reads it one chunk a request within the
// execution's deadline.
func (f *files) uploads(ctx context.Context, tenant string) (*objectSource, error) {
	src := &objectSource{what: "the bucket " + wire.FilesBucket + " of your account", tenants: true}
	js, err := jetstream.NewWithAPIPrefix(f.js.Conn(), uploadsPrefix+tenant)
	if err != nil {
		return nil, err
	}
	src.store, err = js.ObjectStore(ctx, wire.FilesBucket)
	var stream jetstream.Stream
	if err == nil {
		stream, err = js.Stream(ctx, "OBJ_"+wire.FilesBucket)
	}
	switch {
	case errors.Is(err, jetstream.ErrBucketNotFound) || errors.Is(err, jetstream.ErrStreamNotFound):
		return nil, &errInputFile{fmt.Sprintf("input files name uploads, and your account has no bucket %s (the client's PutFile makes it)", wire.FilesBucket)}
	case errors.Is(err, nats.ErrNoResponders):
		// The fleet's NATS configuration is older than uploads: retries would not help.
		return nil, &errInputFile{fmt.Sprintf("input files name uploads, and this fleet's workers cannot read them (%v): its operator renders the NATS server's accounts again with `worker nats-auth`", err)}
	case err != nil:
		return nil, src.failed(fmt.Errorf("input files: the bucket %s of your account: %w", wire.FilesBucket, err))
	}
	src.open = func(ctx context.Context, info *jetstream.ObjectInfo) (io.ReadCloser, error) {
		subject, seq := "$O."+wire.FilesBucket+".C."+info.NUID, uint64(1)
		next := func(ctx context.Context) ([]byte, error) {
			m, err := stream.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(subject))
			if err != nil {
				return nil, err
			}
			seq = m.Sequence + 1
			return m.Data, nil
		}
		return newObjectReader(ctx, info, next, func() {}), nil
	}
	return src, nil
}

// put stores the file of an artifact event, or the image of a display or an
// execute_result event, of
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
	if hev.Type != wire.EventArtifact {
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

// opener returns what reads the objects of bucket, in the fleet's account: the chunks
// of the object info describes (the bucket the worker looked it up in, not the one its
// description names) with an ordered pull consumer, objectChunksAhead at a time. Not
// the library's ObjectStore.Get: its push consumer sends the object at the server's
// pace, not the reader's, and the worker held 60 MB of a 100 MB file that streamed
// into a container.
func (f *files) opener(bucket string) func(context.Context, *jetstream.ObjectInfo) (io.ReadCloser, error) {
	return func(ctx context.Context, info *jetstream.ObjectInfo) (io.ReadCloser, error) {
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
		next := func(ctx context.Context) ([]byte, error) {
			msg, err := it.Next(jetstream.NextContext(ctx))
			if err != nil {
				return nil, err
			}
			return msg.Data(), nil
		}
		return newObjectReader(ctx, info, next, it.Stop), nil
	}
}

// objectReader is an object's bytes, read chunk by chunk and checked against its
// description: no more bytes than its size, and its SHA-256 before the last are given.
type objectReader struct {
	ctx  context.Context // the execution's deadline: a chunk deleted meanwhile never comes
	info *jetstream.ObjectInfo
	next func(context.Context) ([]byte, error) // the next chunk
	stop func()
	buf  []byte
	left int64
	sum  hash.Hash
}

func newObjectReader(ctx context.Context, info *jetstream.ObjectInfo, next func(context.Context) ([]byte, error), stop func()) *objectReader {
	return &objectReader{ctx: ctx, info: info, next: next, stop: stop, left: int64(info.Size), sum: sha256.New()}
}

func (r *objectReader) Read(p []byte) (int, error) {
	for len(r.buf) == 0 {
		if r.left == 0 {
			return 0, io.EOF
		}
		chunk, err := r.next(r.ctx)
		if err != nil {
			return 0, fmt.Errorf("object %q: %w", r.info.Name, err)
		}
		r.buf = chunk
		if len(r.buf) == 0 {
			// The object store writes none: one request per byte at most.
			return 0, fmt.Errorf("object %q: an empty chunk, %d bytes before its end", r.info.Name, r.left)
		}
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
	r.stop()
	return nil
}

// Tenants' files. On a fleet with tenants, each tenant's artifacts and display images
// are stored in a bucket of its own in the fleet's account, wire.TenantFilesBucket,
// bounded on its own (Config.TenantFilesMaxBytes): one tenant's artifacts fill only
// its own. Its account reaches nothing of the fleet's JetStream; its agents read their
// objects from the workers, one chunk a request on wire.SubjectFiles, which arrives as
// jazzmine.files.<tenant> (deploy/nats/auth.conf), served within the tenant's share of
// the background work, at most chunkRate a second: a request costs the fleet a direct
// get of the object's description and one of a chunk, whatever it asks.
// Not the JetStream API under an import: a direct get with a batch reads the whole
// bucket into the server's memory for one request (gigabytes of heap from a few
// dozen requests), and a consumer's deliver subject would make the fleet's
// account publish where the tenant chose.

// filesAll matches the chunk requests of every tenant, and only theirs.
const (
	filesAll   = wire.SubjectFiles + ".*"
	groupFiles = "jazzmine-files"
	// chunkRate and chunkBurst bound the chunk requests a worker serves a tenant: 512
	// a second (64 MiB/s of 128 KiB chunks), 128 at once. A request costs the tenant
	// ~100 bytes and the fleet a chunk's read and send, to a reply subject nobody may
	// listen to: a flood of them amplifies a tenant's few bytes into the fleet's
	// megabytes. Beyond the rate a request is answered at once, busy, with no read.
	chunkRate  = 512
	chunkBurst = 128
)

// tenantBucket is a tenant's bucket as this worker knows it: made or looked up once
// (ready closed), or being made or looked up.
type tenantBucket struct {
	name   string
	made   bool // created or updated to the configured bound by this worker
	ready  chan struct{}
	store  jetstream.ObjectStore
	stream jetstream.Stream // its stream, for chunks by sequence
	err    error
}

// tenantBucket returns tenant's bucket. With create (a store), it is created or updated
// to the configured bound at this worker's first store; without (a read), a bucket
// this worker has not seen is looked up, not made: reads name no bucket into being.
// One caller makes or looks up; others wait for it, and the buckets of other tenants
// wait for nothing. A failure is forgotten: the next use tries again.
func (f *files) tenantBucket(ctx context.Context, tenant string, create bool) (*tenantBucket, error) {
	f.mu.Lock()
	b, ok := f.tenants[tenant]
	mine := !ok || create && !b.made
	if mine {
		b = &tenantBucket{name: wire.TenantFilesBucket(tenant), made: create, ready: make(chan struct{})}
		if f.tenants == nil {
			f.tenants = map[string]*tenantBucket{}
		}
		f.tenants[tenant] = b
	}
	f.mu.Unlock()
	if mine {
		if create {
			cfg := f.tenantCfg
			cfg.Bucket = b.name
			b.store, b.err = f.js.CreateOrUpdateObjectStore(ctx, cfg)
		} else {
			b.store, b.err = f.js.ObjectStore(ctx, b.name)
		}
		if b.err == nil {
			b.stream, b.err = f.js.Stream(ctx, "OBJ_"+b.name)
		}
		if b.err != nil {
			b.err = fmt.Errorf("object store %s: %w", b.name, b.err)
			f.forget(tenant, b)
		}
		close(b.ready)
	}
	select {
	case <-b.ready:
		return b, b.err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// forget drops b, tenant's bucket, if it is still the one this worker knows: it is
// made or looked up again at its next use (an operator may have deleted it).
func (f *files) forget(tenant string, b *tenantBucket) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.tenants[tenant] == b {
		delete(f.tenants, tenant)
	}
}

// putFailed returns the error of a store in b, tenant's bucket, that failed with err:
// an *errBucketFull when the bucket is at its bound. A bucket that failed otherwise
// is forgotten (an execution cut short is no reason).
func (f *files) putFailed(tenant string, b *tenantBucket, err error) error {
	switch {
	case storeFull(err):
		return &errBucketFull{err: err, bucket: b.name, limit: f.tenantCfg.MaxBytes}
	case !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded):
		f.forget(tenant, b)
	}
	return err
}

// errBucketFull is the failure to store a file in a tenant's bucket at its bound:
// the tenant's own limit (an artifact_limit error), not the fleet's failure.
type errBucketFull struct {
	err    error
	bucket string
	limit  int64
}

func (e *errBucketFull) Error() string {
	return fmt.Sprintf("%v: the tenant's bucket %s is full (%d bytes, the workers' tenant_files_max_bytes); its objects expire with the events", e.err, e.bucket, e.limit)
}

func (e *errBucketFull) Unwrap() error { return e.err }

// codeStreamStoreFailed is the JetStream API error code of a message refused by a
// stream at its MaxBytes with DiscardNew ("store failed"; its only other cause is a
// message over 32 MiB, and a chunk is 128 KiB), which nats.go does not name. The
// account or the server out of storage is another code, 10047: the fleet's failure.
const codeStreamStoreFailed = jetstream.ErrorCode(10077)

// storeFull reports whether err says that a stream refused a message at its bound.
func storeFull(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && apiErr.ErrorCode == codeStreamStoreFailed
}

// see is the handler of filesAll: a tenant's chunk request, served in the background
// within the tenant's rate (chunkRate).
func (f *files) see(m *nats.Msg) {
	f.bg.serveTenant(m, wire.ParseFilesSubject, f.rates, func(ctx context.Context, tenant string) *nats.Msg {
		reply := &nats.Msg{Header: nats.Header{wire.HeaderContentType: {wire.ContentTypeBytes}}}
		if err := f.chunk(ctx, tenant, m.Data, reply); err != nil {
			reply.Data = nil
			reply.Header.Set(wire.HeaderError, err.Error())
		}
		return reply
	})
}

// chunk fills reply with the chunk that req, a wire.ChunkRequest, asks of tenant's
// bucket, with the object's size and where the next chunk is.
func (f *files) chunk(ctx context.Context, tenant string, req []byte, reply *nats.Msg) error {
	var r wire.ChunkRequest
	if err := json.Unmarshal(req, &r); err != nil || r.Object == "" {
		return fmt.Errorf(`a chunk request is {"object": name, "from": sequence} in JSON, got %.80q`, req)
	}
	// The name goes into a subject of the lookup (base64, a third longer): unbounded,
	// it made a line longer than the server's max_control_line, which closes the
	// worker's connection for good.
	if len(r.Object) > wire.MaxObjectNameLength {
		return fmt.Errorf("object name of %d bytes: at most %d", len(r.Object), wire.MaxObjectNameLength)
	}
	b, err := f.tenantBucket(ctx, tenant, false)
	if errors.Is(err, jetstream.ErrBucketNotFound) || errors.Is(err, jetstream.ErrStreamNotFound) {
		return fmt.Errorf("object %q: %w", r.Object, jetstream.ErrObjectNotFound)
	} else if err != nil {
		return errors.New("the tenant's bucket is not available")
	}
	info, err := b.store.GetInfo(ctx, r.Object)
	if err != nil {
		if !errors.Is(err, jetstream.ErrObjectNotFound) {
			f.forget(tenant, b)
		}
		return fmt.Errorf("object %q: %w", r.Object, err)
	}
	reply.Header.Set(wire.HeaderObjectSize, strconv.FormatUint(info.Size, 10))
	if info.Size == 0 {
		return nil
	}
	msg, err := b.stream.GetMsg(ctx, r.From, jetstream.WithGetMsgSubject("$O."+b.name+".C."+info.NUID))
	if err != nil {
		return fmt.Errorf("object %q from %d: %w", r.Object, r.From, err)
	}
	reply.Data = msg.Data
	reply.Header.Set(wire.HeaderNextChunk, strconv.FormatUint(msg.Sequence+1, 10))
	return nil
}
