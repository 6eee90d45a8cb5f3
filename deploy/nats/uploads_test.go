package nats_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jazzmine/worker/client"
	"github.com/jazzmine/worker/internal/testenv"
	"github.com/jazzmine/worker/internal/testworker"
	"github.com/jazzmine/worker/sandboxpool"
	"github.com/jazzmine/worker/wire"
	"github.com/jazzmine/worker/worker"
)

// TestATenantUploadsInputFilesOfItsOwn runs a fleet for two tenants from the
// configuration `worker nats-auth` renders. Alpha uploads a file larger than a job
// holds, as the Go client's InputFile does, and its job reads it whole. Beta, hostile,
// knows the object's name and the subjects the workers read it on: its jobs that name
// alpha's upload find nothing of alpha's, its requests on those subjects are refused,
// and the uploads it forges in its own bucket (a description larger than the
// workspace, sizes that wrap when added up, chunks named by a wildcard, empty chunks,
// chunks that do not hash to its digest, no chunks, a bucket the workers cannot read,
// made by a third tenant) each end its own job with an input_file error, at once, and
// leave the worker serving alpha.
func TestATenantUploadsInputFilesOfItsOwn(t *testing.T) {
	const workspace = 8 << 20
	url, workerSeed, seeds := testenv.TenantsNATS(t, "alpha", "beta", "gamma")
	testworker.Start(t, testenv.ConnectSeed(t, url, workerSeed, nil), testworker.Options{ID: fmt.Sprintf("test-uploads-%d", time.Now().UnixNano()), Sandbox: sandboxpool.Sandbox{PoolSize: 1},
		Worker: func(c *worker.Config) { c.Sandboxes[0].MaxInputBytes = workspace }})
	anc, bnc, gnc := testenv.ConnectSeed(t, url, seeds["alpha"], nil), testenv.ConnectSeed(t, url, seeds["beta"], nil), testenv.ConnectSeed(t, url, seeds["gamma"], nil)
	alpha, beta := tenantClient(t, anc), tenantClient(t, bnc)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	content := bytes.Repeat([]byte("alpha's upload "), 70_000) // 1 MB: several chunks, past a job's 256 KiB
	local := filepath.Join(t.TempDir(), "data.bin")
	if err := os.WriteFile(local, content, 0o600); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(content)
	hashScript := "import hashlib\nemit_result(hashlib.sha256(open('data.bin','rb').read()).hexdigest())"
	file, err := alpha.InputFile(ctx, local, "")
	if err != nil || file.Object == "" || file.Bucket != wire.FilesBucket {
		t.Fatalf("alpha's upload: %+v, %v; want an object of %s", file, err, wire.FilesBucket)
	}
	res, err := alpha.Run(ctx, wire.Job{Sandbox: "default", Files: []wire.File{file}, Script: hashScript})
	if err != nil || !res.Success || res.FinalData != hex.EncodeToString(sum[:]) {
		t.Fatalf("alpha's job with its upload: %+v, %v; want the SHA-256 of its %d bytes", res, err, len(content))
	}

	run := func(who string, c *client.Client, f wire.File) *client.Result {
		t.Helper()
		start := time.Now()
		res, err := c.Run(ctx, wire.Job{Sandbox: "default", Files: []wire.File{f}, Script: hashScript})
		if err != nil {
			t.Fatalf("%s's job: %v", who, err)
		}
		t.Logf("%s: %s %q after %v", who, res.ErrorKind, res.Error, time.Since(start).Round(time.Millisecond))
		return res
	}
	refused := func(who string, res *client.Result, want string) {
		t.Helper()
		if res.Success || strings.Contains(res.Stdout+fmt.Sprint(res.FinalData), "alpha") {
			t.Errorf("BROKEN: %s ran: %+v", who, res)
		} else if res.ErrorKind != wire.KindInputFile || !strings.Contains(res.Error, want) {
			t.Errorf("%s ended as %s %q; want an input_file error that says %q", who, res.ErrorKind, res.Error, want)
		}
	}
	// Beta names alpha's upload: before it has a bucket, and after.
	refused("beta's job naming alpha's upload, with no bucket of its own", run("beta", beta, file), "your account has no bucket "+wire.FilesBucket)
	if err := beta.PutFile(ctx, "uploads/mine", strings.NewReader("beta's own")); err != nil {
		t.Fatalf("beta's upload: %v", err)
	}
	refused("beta's job naming alpha's upload", run("beta", beta, file), "is not in the bucket "+wire.FilesBucket+" of your account")
	other := file
	other.Bucket = wire.TenantFilesBucket("alpha")
	refused("beta's job naming alpha's artifacts' bucket", run("beta", beta, other), "a tenant's job names its artifacts")

	// Beta asks on the subjects the workers read uploads on, and for a batch of its own.
	for subj, body := range map[string]string{
		"jazzmine.uploads.alpha.DIRECT.GET.OBJ_" + wire.FilesBucket:  `{"seq":1}`,
		"jazzmine.uploads.alpha.STREAM.INFO.OBJ_" + wire.FilesBucket: ``,
		"$JS.API.DIRECT.GET.OBJ_" + wire.FilesBucket:                 `{"seq":1,"batch":1000000}`,
		"$JS.API.STREAM.DELETE.OBJ_" + wire.FilesBucket:              ``,
	} {
		if m, err := bnc.Request(subj, []byte(body), time.Second); err == nil && !strings.Contains(string(m.Data), `"error"`) {
			t.Errorf("BROKEN: beta's request on %s was answered: %.200q", subj, m.Data)
		}
	}

	// Beta forges descriptions in its own bucket.
	bjs, err := jetstream.New(bnc)
	if err != nil {
		t.Fatal(err)
	}
	store, err := bjs.ObjectStore(ctx, wire.FilesBucket)
	if err != nil {
		t.Fatal(err)
	}
	real, err := store.GetInfo(ctx, "uploads/mine")
	if err != nil {
		t.Fatal(err)
	}
	forge := func(name string, edit func(*jetstream.ObjectInfo)) wire.File {
		t.Helper()
		info := *real
		info.Name, info.ModTime = name, time.Time{}
		edit(&info)
		meta, err := json.Marshal(info)
		if err != nil {
			t.Fatal(err)
		}
		msg := nats.NewMsg("$O." + wire.FilesBucket + ".M." + base64.URLEncoding.EncodeToString([]byte(name)))
		msg.Header.Set("Nats-Rollup", "sub")
		msg.Data = meta
		if _, err := bjs.PublishMsg(ctx, msg); err != nil {
			t.Fatalf("beta's forged description %s: %v", name, err)
		}
		return wire.File{Path: "data.bin", Object: name, Bucket: wire.FilesBucket}
	}
	huge := forge("forged/huge", func(i *jetstream.ObjectInfo) { i.Size = 1 << 40 })
	refused("beta's upload of 1 TiB", run("beta", beta, huge), "more than the workspace")
	// Sizes that wrap when added up, with a real upload (a review's: two of 2^62
	// bytes, or one of 2^64 - 1 MiB, passed the workspace's check).
	for _, size := range []uint64{1<<63 + 5, math.MaxUint64 - 1<<20 + 1, 1 << 62} {
		f := forge(fmt.Sprintf("forged/size-%d", size), func(i *jetstream.ObjectInfo) { i.Size = size })
		g := f
		g.Path = "again.bin"
		mine := wire.File{Path: "mine.bin", Object: "uploads/mine", Bucket: wire.FilesBucket}
		res, err := beta.Run(ctx, wire.Job{Sandbox: "default", Files: []wire.File{mine, f, g}, Script: hashScript})
		if err != nil {
			t.Fatal(err)
		}
		refused(fmt.Sprintf("beta's two uploads of %d bytes", size), res, "claims")
	}
	// Chunks named by a wildcard, to walk the whole bucket (a review's: 2 million
	// messages of beta's walked at each read held the worker's connection 0.3 s).
	for _, nuid := range []string{"*.x", ">", "*"} {
		refused("beta's upload whose chunks are "+nuid, run("beta", beta, forge("forged/wild", func(i *jetstream.ObjectInfo) { i.NUID = nuid })), "not a NUID")
	}
	const emptyChunks = "AAAAAAAAAAAAAAAAAAAAAA"
	for range 3 {
		if _, err := bjs.Publish(ctx, "$O."+wire.FilesBucket+".C."+emptyChunks, nil); err != nil {
			t.Fatal(err)
		}
	}
	empty := forge("forged/empty", func(i *jetstream.ObjectInfo) { i.NUID = emptyChunks })
	refused("beta's upload of empty chunks", run("beta", beta, empty), "an empty chunk")
	digest := forge("forged/digest", func(i *jetstream.ObjectInfo) {
		i.Digest = "SHA-256=" + base64.URLEncoding.EncodeToString(make([]byte, 32))
	})
	refused("beta's upload whose chunks are not its digest's", run("beta", beta, digest), "do not hash to its digest")
	nochunks := forge("forged/nochunks", func(i *jetstream.ObjectInfo) { i.NUID = "BBBBBBBBBBBBBBBBBBBBBB" })
	refused("beta's upload with no chunks", run("beta", beta, nochunks), "forged/nochunks")

	// Gamma made its bucket's stream itself, without direct gets: the workers cannot
	// read it, and say so at once rather than try again.
	gjs, err := jetstream.New(gnc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := gjs.CreateStream(ctx, jetstream.StreamConfig{Name: "OBJ_" + wire.FilesBucket,
		Subjects: []string{"$O." + wire.FilesBucket + ".C.>", "$O." + wire.FilesBucket + ".M.>"}, AllowRollup: true}); err != nil {
		t.Fatalf("gamma's own stream: %v", err)
	}
	refused("gamma's job naming an object of a bucket without direct gets", run("gamma", tenantClient(t, gnc), file), "look up object")

	// The worker still serves alpha.
	res, err = alpha.Run(ctx, wire.Job{Sandbox: "default", Files: []wire.File{file}, Script: hashScript})
	if err != nil || !res.Success || res.FinalData != hex.EncodeToString(sum[:]) {
		t.Errorf("alpha's job with its upload after beta's: %+v, %v", res, err)
	}
	if err := alpha.DeleteFile(ctx, file.Object); err != nil {
		t.Errorf("alpha deletes its upload: %v", err)
	}
	refused("alpha's job naming its deleted upload", run("alpha", alpha, file), "is not in the bucket")
}
