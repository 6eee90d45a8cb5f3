package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jazzmine/worker/wire"
)

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
