package worker_test

// Attack tests of the files feature (input files, artifacts, display images), played
// by a hostile agent and a hostile script. Each test states the attack and what must
// hold; a test that fails shows a break.

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"io"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jazzmine/worker/client"
	"github.com/jazzmine/worker/internal/testenv"
	"github.com/jazzmine/worker/wire"
	"github.com/jazzmine/worker/worker"
)

// runTenantJob publishes job as tenant would have it arrive in the fleet's account
// (jazzmine.exec.<tenant>.<sandbox>, the subject the server writes for a tenant's
// jazzmine.exec.<sandbox>, or jazzmine.session.<tenant>.<sandbox>.<session_id> for a
// session call) and returns its events, read from jazzmine.events.<tenant>.<id>.>
// until script_done.
func runTenantJob(t *testing.T, nc *nats.Conn, tenant string, job wire.Job) []*wire.Event {
	t.Helper()
	return submitTenantJob(t, nc, tenant, job)()
}

// submitTenantJob publishes job as runTenantJob does, and returns what waits for its
// events until script_done (on the test's goroutine: it may fail the test).
func submitTenantJob(t *testing.T, nc *nats.Conn, tenant string, job wire.Job) (wait func() []*wire.Event) {
	t.Helper()
	if job.Sandbox == "" {
		job.Sandbox = "default"
	}
	sub, err := nc.SubscribeSync("jazzmine.events." + tenant + "." + job.ExecutionID + ".>")
	if err != nil {
		t.Fatal(err)
	}
	data, err := wire.EncodeJob(wire.ContentTypeJSON, &job)
	if err != nil {
		t.Fatal(err)
	}
	subject := "jazzmine.exec." + tenant + "." + job.Sandbox
	if job.SessionID != "" {
		subject = wire.TenantSessionSubject(tenant, job.Sandbox, job.SessionID)
	}
	a := newAgent(t, nc)
	if err := a.publish(subject, data, map[string]string{wire.HeaderMsgID: job.ExecutionID, wire.HeaderContentType: wire.ContentTypeJSON}); err != nil {
		t.Fatal(err)
	}
	return func() []*wire.Event {
		t.Helper()
		defer sub.Unsubscribe()
		var evs []*wire.Event
		deadline := time.Now().Add(2 * time.Minute)
		for time.Now().Before(deadline) {
			msg, err := sub.NextMsg(time.Until(deadline))
			if err != nil {
				t.Fatalf("events of %s/%s: %v (got %s)", tenant, job.ExecutionID, err, describe(evs))
			}
			ev, err := wire.DecodeEvent(msg.Header.Get(wire.HeaderContentType), msg.Data)
			if err != nil {
				t.Fatal(err)
			}
			evs = append(evs, ev)
			if ev.Type == wire.EventScriptDone {
				return evs
			}
		}
		t.Fatalf("no script_done for %s/%s", tenant, job.ExecutionID)
		return nil
	}
}

// TestAttackTenantReadsAnotherTenantsArtifactByObjectReference: on a fleet with
// tenants, the buckets are in the fleet's account, and the worker reads whatever
// object a job's file names. A tenant that knows (or guesses) another tenant's
// execution id names that tenant's artifact as its own input file and would read it
// in its script: the worker a confused deputy across the tenant boundary. A tenant's
// object names are looked up in its own bucket only: the attacker's job fails with
// input_file, and the victim's own next job reads its artifact as an input.
func TestAttackTenantReadsAnotherTenantsArtifactByObjectReference(t *testing.T) {
	_, nc := testenv.NATS(t)
	startWorker(t, nc, 1, 0, nil)
	newFilesAgent(t, nc) // waits for the bucket

	victimID := newID("quarterly-report")
	evs := runTenantJob(t, nc, "victim", wire.Job{ExecutionID: victimID, Mode: wire.ModeInteractive, Script: `import os
os.makedirs("out")
open("out/secret.txt", "w").write("TOP SECRET of the victim tenant")`})
	art := find(evs, wire.EventArtifact)
	if art == nil {
		t.Fatalf("the victim's execution stored no artifact: %s", describe(evs))
	}

	evs = runTenantJob(t, nc, "evil", wire.Job{ExecutionID: newID("evil"),
		Files:  []wire.File{{Path: "stolen.txt", Object: art.Object}},
		Script: `emit_result(open("stolen.txt").read())`})
	if res := find(evs, wire.EventFinalResult); res != nil {
		b, _ := json.Marshal(res.Data)
		if strings.Contains(string(b), "TOP SECRET") {
			t.Fatalf("BROKEN: tenant evil read tenant victim's artifact %s through an input file: %s", art.Object, b)
		}
	}
	if e := find(evs, wire.EventError); e == nil || e.Kind != wire.KindInputFile {
		t.Errorf("a tenant's input object was not refused: %s", describe(evs))
	}
	evs = runTenantJob(t, nc, "victim", wire.Job{ExecutionID: newID("victim"),
		Files:  []wire.File{{Path: "report.txt", Object: art.Object}},
		Script: `emit_result(open("report.txt").read())`})
	if res := find(evs, wire.EventFinalResult); res == nil || res.Data != "TOP SECRET of the victim tenant" {
		t.Errorf("the victim's job naming its own artifact as an input: %s; want its content", describe(evs))
	}
}

// TestAttackInputObjectGoneMidJobDoesNotHangTheWorker: an agent names two input
// objects, a large one and a small one, and deletes the small one (an ordinary
// ObjectStore.Delete, or a Put of a new version under the name, which purges the
// old chunks) while the first still streams into the container. The worker looked
// the object's info up before it took the container, and then reads the chunks of
// that version, which are gone. The job must still end by its deadline (an
// input_file error or a timeout) and the worker must stay usable; a reader that waits
// for chunks that never come holds the job, its container slot and the worker's
// shutdown forever.
func TestAttackInputObjectGoneMidJobDoesNotHangTheWorker(t *testing.T) {
	srv, nc := testenv.NATS(t)
	wnc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	startWorker(t, wnc, 1, 0, nil)
	var hung bool
	t.Cleanup(func() {
		if hung {
			wnc.Close() // ends the stuck read, so that the worker's shutdown can finish
		} else {
			defer wnc.Close()
		}
	})
	a := newFilesAgent(t, nc)

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	big := io.LimitReader(pattern{}, 48<<20)
	if _, err := a.store.Put(ctx, jetstream.ObjectMeta{Name: "attack/big.bin"}, big); err != nil {
		t.Fatal(err)
	}
	if _, err := a.store.PutBytes(ctx, "attack/small.txt", []byte("small")); err != nil {
		t.Fatal(err)
	}

	id := newID("gone")
	started, err := nc.SubscribeSync("jazzmine.events." + id + ".started")
	if err != nil {
		t.Fatal(err)
	}
	type outcome struct {
		res *client.Result
		err error
	}
	done := make(chan outcome, 1)
	go func() {
		rctx, rcancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer rcancel()
		res, err := a.c.Run(rctx, wire.Job{Sandbox: "default", ExecutionID: id, TimeoutSec: 2,
			Files:  []wire.File{{Path: "big.bin", Object: "attack/big.bin"}, {Path: "small.txt", Object: "attack/small.txt"}},
			Script: `emit_result(open("small.txt").read())`})
		done <- outcome{res, err}
	}()
	if _, err := started.NextMsg(time.Minute); err != nil {
		t.Fatalf("the job did not start: %v", err)
	}
	if err := a.store.Delete(ctx, "attack/small.txt"); err != nil {
		t.Fatal(err)
	}
	// The job's deadline is 2 s + the executor's 5 s buffer.
	select {
	case o := <-done:
		if o.err != nil {
			t.Fatalf("run: %v", o.err)
		}
		if o.res.Success {
			t.Logf("the job read the small file before its deletion took effect: %v", o.res.FinalData)
		} else if o.res.ErrorKind != wire.KindInputFile && o.res.ErrorKind != wire.KindTimeout {
			t.Errorf("ended as %s: %s; want input_file or timeout", o.res.ErrorKind, o.res.Error)
		}
	case <-time.After(45 * time.Second):
		hung = true
		t.Fatalf("BROKEN: 45 s after the start of a job with a 2 s timeout, it has not ended: the worker waits for the chunks of a deleted input object (worker/files.go objectReader.Read calls it.Next() with no deadline)")
	}
}

// TestAttackScriptFileOverwritesItsDisplayImage: display images are stored at
// executions/<key>/<attempt>/display/<n>.<ext>, and artifacts at
// executions/<key>/<attempt>/<workspace path>. A script that leaves a file at the
// workspace path display/1.png, in a job that asks for the artifact path "display",
// has it stored under the very object name of its first display image: the object
// the display event announced (with its size and SHA-256) is replaced, and an agent
// that downloads the display's image gets the script's file, or a checksum error.
// Object names of display images and of workspace files must not meet.
func TestAttackScriptFileOverwritesItsDisplayImage(t *testing.T) {
	_, nc := testenv.NATS(t)
	startWorker(t, nc, 1, 0, nil)
	a := newFilesAgent(t, nc)

	res := a.run(wire.Job{Artifacts: []string{"display"}, Script: `import os
class Img:
    def _repr_png_(self):
        return b"\x89PNG\r\n\x1a\n the harness's display image"
display(Img())
os.makedirs("display")
open("display/1.png", "wb").write(b"the script's own file, posing as the display image")
emit_result(1)`})
	if !res.Success {
		t.Fatalf("failed: %s %s", res.ErrorKind, res.Error)
	}
	if len(res.Displays) != 1 || res.Displays[0].Image == nil {
		t.Fatalf("displays %+v; want one with an image", res.Displays)
	}
	img := res.Displays[0].Image
	for _, art := range res.Artifacts {
		if art.Object == img.Object {
			t.Errorf("BROKEN: the artifact %s is stored as %s, the object of the display image", art.Path, art.Object)
		}
	}
	var buf bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := a.c.Download(ctx, img, &buf); err != nil {
		t.Errorf("BROKEN: the display image no longer downloads: %v", err)
	}
}

// TestAttackHostAcceptsDotPaths: the spec (and the harness) refuse "." as a path, the
// host's wire.ValidatePath lets it through (path.Clean(".") == "."). The harness
// refuses it again, so nothing leaks, but an agent's "." reaches the container: an
// input file "." is an input_file error found in the sandbox instead of invalid_job,
// and an artifact "." would name the whole workspace to any harness that trusted the
// host. Held by the harness; the host should refuse it as documented.
func TestAttackHostAcceptsDotPaths(t *testing.T) {
	for _, p := range []string{".", "a/.", "./a"} {
		if err := wire.ValidatePath("path", p); err == nil {
			t.Errorf("wire.ValidatePath accepts %q; the contract refuses '.' components", p)
		}
	}
}

// TestAttackSparseFileStoresMoreThanTheWorkspaceHolds: max_artifact_bytes goes up to
// 1 GiB a job, and the bucket JAZZMINE_FILES has no MaxBytes. A script that owns a
// 64 MiB workspace makes a sparse file (truncate: no page of the workspace used) of
// hundreds of MiB and has the worker store it: every job of every agent may push up to
// 1 GiB of zeros into the NATS server's file storage, kept an hour, for nothing, until
// the server's disk (the one that holds every tenant's jobs and events) is full. An
// execution must not store more than its workspace could hold (plus its display
// images), and the bucket needs a MaxBytes of its own.
func TestAttackSparseFileStoresMoreThanTheWorkspaceHolds(t *testing.T) {
	_, nc := testenv.NATS(t)
	startWorker(t, nc, 1, 0, nil)
	a := newFilesAgent(t, nc)

	res := a.run(wire.Job{MaxArtifactBytes: 1 << 30, TimeoutSec: 60, Script: `import os
os.makedirs("out")
st = os.statvfs(".")
with open("out/zeros.bin", "wb") as f:
    f.truncate(200 << 20)
emit_result(st.f_blocks * st.f_frsize)`})
	workspace, _ := res.FinalData.(int64)
	if workspace == 0 {
		t.Fatalf("no workspace size: %s %s %v", res.ErrorKind, res.Error, res.FinalData)
	}
	var stored int64
	for _, art := range res.Artifacts {
		stored += art.Size
	}
	if stored > workspace {
		t.Errorf("BROKEN: an execution with a %d-byte workspace stored %d bytes of artifacts (a sparse file)", workspace, stored)
	}
}

// TestAttackInputObjectWhoseChunksDoNotMatchItsDigest: the worker's object reader
// checks the SHA-256 of an input object's chunks against its digest once it reads
// past the last byte, but the executor reads exactly the announced size
// (io.ReadFull) and never asks for more: the check never runs. An object whose
// chunks are not the ones its info names (a meta message written by hand, as any
// client of the account can, pointing at other chunks with another digest; or
// chunks damaged in the store) goes into the workspace unchecked. It must be an
// input_file error.
func TestAttackInputObjectWhoseChunksDoNotMatchItsDigest(t *testing.T) {
	_, nc := testenv.NATS(t)
	startWorker(t, nc, 1, 0, nil)
	a := newFilesAgent(t, nc)

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	info, err := a.store.PutBytes(ctx, "attack/real.txt", []byte("the real bytes"))
	if err != nil {
		t.Fatal(err)
	}
	forged := *info
	forged.Name = "attack/forged.txt"
	forged.Digest = "SHA-256=" + base64.URLEncoding.EncodeToString(make([]byte, 32)) // not the chunks' hash
	forged.ModTime = time.Time{}
	meta, err := json.Marshal(forged)
	if err != nil {
		t.Fatal(err)
	}
	msg := nats.NewMsg("$O." + wire.FilesBucket + ".M." + base64.URLEncoding.EncodeToString([]byte(forged.Name)))
	msg.Header.Set("Nats-Rollup", "sub")
	msg.Data = meta
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.PublishMsg(ctx, msg); err != nil {
		t.Fatal(err)
	}
	if got, err := a.store.GetInfo(ctx, forged.Name); err != nil || got.Digest != forged.Digest {
		t.Fatalf("the forged object is not in the bucket: %v %+v", err, got)
	}

	res := a.run(wire.Job{Files: []wire.File{{Path: "in.txt", Object: forged.Name}}, Script: `emit_result(open("in.txt").read())`})
	if res.Success {
		t.Errorf("BROKEN: an input object whose chunks do not hash to its digest went into the workspace: the script read %v", res.FinalData)
	} else if res.ErrorKind != wire.KindInputFile {
		t.Errorf("ended as %s: %s; want input_file", res.ErrorKind, res.Error)
	}
}

// TestAttackATenantFillsTheFilesBucketForAnother: a tenant's scripts leave as many
// artifacts as they may, until the bucket they are stored in is full. Were every
// tenant's artifacts in the fleet's one bucket, another tenant's next artifact would
// then fail to store, and its execution with it. Each tenant's artifacts go to a
// bucket of its own, bounded on its own: the hostile tenant's execution fails as
// artifact_limit, once (not retried as the fleet's failure), and the other tenant's
// and the fleet's own artifacts are stored and read back whole.
func TestAttackATenantFillsTheFilesBucketForAnother(t *testing.T) {
	_, nc := testenv.NATS(t)
	const bound = 4 << 20
	startWorker(t, nc, 1, 0, func(c *worker.Config) { c.FilesMaxBytes, c.TenantFilesMaxBytes = bound, bound })
	fa := newFilesAgent(t, nc)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	evs := runTenantJob(t, nc, "hog", wire.Job{ExecutionID: newID("hog"), Mode: wire.ModeInteractive, Script: `import os
os.makedirs("out")
for i in range(6):
    open(f"out/{i}.bin", "wb").write(os.urandom(1 << 20))`})
	done := find(evs, wire.EventScriptDone)
	if e := find(evs, wire.EventError); done == nil || done.Success || done.Attempt != 1 || e == nil || e.Kind != wire.KindArtifactLimit ||
		!strings.Contains(e.Error, "JAZZMINE_FILES_hog is full") {
		t.Errorf("the hog's execution past its bucket's bound: %s; want one attempt failing as artifact_limit, naming its full bucket", describe(evs))
	}
	if n := count(evs, wire.EventArtifact); n == 0 || n >= 6 {
		t.Errorf("the hog stored %d of its 6 artifacts; want those its bucket holds", n)
	}

	// The other tenant, and the fleet's own account, store theirs.
	read := func(who string, art *wire.Event, want string) {
		t.Helper()
		store, err := js.ObjectStore(ctx, art.Bucket)
		if err != nil {
			t.Fatalf("%s's bucket %s: %v", who, art.Bucket, err)
		}
		got, err := store.GetBytes(ctx, art.Object)
		if err != nil || string(got) != want {
			t.Errorf("%s's artifact %s/%s: %.40q, %v; want what its script wrote", who, art.Bucket, art.Object, got, err)
		}
	}
	script := `import os
os.makedirs("out")
open("out/a.txt", "w").write("x" * (1 << 20))`
	evs = runTenantJob(t, nc, "calm", wire.Job{ExecutionID: newID("calm"), Mode: wire.ModeInteractive, Script: script})
	if art := find(evs, wire.EventArtifact); art == nil || art.Bucket != wire.TenantFilesBucket("calm") {
		t.Errorf("the calm tenant's execution beside the hog's full bucket: %s; want its artifact in its own bucket", describe(evs))
	} else {
		read("the calm tenant", art, strings.Repeat("x", 1<<20))
	}
	// An operator deletes the calm tenant's bucket: the worker makes it again, at
	// the latest for the execution after the one that found it gone.
	if err := js.DeleteObjectStore(ctx, wire.TenantFilesBucket("calm")); err != nil {
		t.Fatal(err)
	}
	runTenantJob(t, nc, "calm", wire.Job{ExecutionID: newID("calm"), Mode: wire.ModeInteractive, Script: script})
	evs = runTenantJob(t, nc, "calm", wire.Job{ExecutionID: newID("calm"), Mode: wire.ModeInteractive, Script: script})
	if art := find(evs, wire.EventArtifact); art == nil || art.Bucket != wire.TenantFilesBucket("calm") {
		t.Errorf("the calm tenant's execution after its bucket was deleted: %s; want its artifact stored again", describe(evs))
	}
	res, err := fa.c.Run(ctx, wire.Job{Sandbox: "default", Mode: wire.ModeInteractive, Script: script})
	if err != nil || !res.Success || len(res.Artifacts) != 1 || res.Artifacts[0].Bucket != wire.FilesBucket {
		t.Fatalf("the fleet's own execution: %+v, %v; want its artifact in %s", res, err, wire.FilesBucket)
	}
	read("the fleet", &wire.Event{Bucket: res.Artifacts[0].Bucket, Object: res.Artifacts[0].Object}, strings.Repeat("x", 1<<20))
}

// TestATenantsChunkRequestsReadOnlyItsOwnObjects: a tenant's agents read their
// artifacts from the workers, one chunk a request on jazzmine.files.<tenant> (its
// jazzmine.files). The chunks of one object follow each other to its size, an empty
// object has none, and a request that is not JSON, names another tenant's object, asks
// past the end or names an object of 3,500 bytes gets an error and no bytes. The last
// made the worker's lookup a line longer than the server takes, which closed its
// connection for good (a review's attack); the worker answers the next request. A
// flood of requests is answered busy beyond the tenant's rate, and another tenant's
// request meanwhile is served.
func TestATenantsChunkRequestsReadOnlyItsOwnObjects(t *testing.T) {
	_, nc := testenv.NATS(t)
	startWorker(t, nc, 1, 0, nil)
	newFilesAgent(t, nc)
	evs := runTenantJob(t, nc, "t1", wire.Job{ExecutionID: newID("t1"), Mode: wire.ModeInteractive, Script: `import os
os.makedirs("out")
open("out/a.bin", "wb").write(bytes(range(256)) * 1200)
open("out/empty", "wb").close()`})
	objects := map[string]*wire.Event{}
	for _, ev := range evs {
		if ev.Type == wire.EventArtifact {
			objects[ev.Path] = ev
		}
	}
	if len(objects) != 2 {
		t.Fatalf("the tenant's job: %s; want two artifacts", describe(evs))
	}
	ask := func(tenant string, body any) *nats.Msg {
		t.Helper()
		b, ok := body.([]byte)
		if !ok {
			b, _ = json.Marshal(body)
		}
		m, err := nc.Request(wire.SubjectFiles+"."+tenant, b, 10*time.Second)
		if err != nil {
			t.Fatalf("chunk request %.80s: %v", b, err)
		}
		if ct := m.Header.Get(wire.HeaderContentType); ct != wire.ContentTypeBytes {
			t.Errorf("an answer's Content-Type is %q, want %q (never an event's)", ct, wire.ContentTypeBytes)
		}
		return m
	}
	var got []byte
	req := wire.ChunkRequest{Object: objects["out/a.bin"].Object}
	for chunks := 0; len(got) < 256*1200; chunks++ {
		m := ask("t1", req)
		if e := m.Header.Get(wire.HeaderError); e != "" || len(m.Data) == 0 || chunks > 10 {
			t.Fatalf("chunk %d from %d: %q, %d bytes", chunks, req.From, e, len(m.Data))
		}
		got = append(got, m.Data...)
		next, _ := strconv.ParseUint(m.Header.Get(wire.HeaderNextChunk), 10, 64)
		req.From = next
	}
	if !bytes.Equal(got, bytes.Repeat(func() []byte {
		b := make([]byte, 256)
		for i := range b {
			b[i] = byte(i)
		}
		return b
	}(), 1200)) {
		t.Error("the chunks of out/a.bin are not its bytes")
	}
	if m := ask("t1", wire.ChunkRequest{Object: objects["out/empty"].Object}); len(m.Data) != 0 || m.Header.Get(wire.HeaderObjectSize) != "0" || m.Header.Get(wire.HeaderError) != "" {
		t.Errorf("the empty object: %d bytes, size %q, error %q", len(m.Data), m.Header.Get(wire.HeaderObjectSize), m.Header.Get(wire.HeaderError))
	}
	for name, m := range map[string]*nats.Msg{
		"not JSON":              ask("t1", []byte("give me everything")),
		"another tenant's":      ask("t2", wire.ChunkRequest{Object: objects["out/a.bin"].Object}),
		"past the object's end": ask("t1", wire.ChunkRequest{Object: objects["out/a.bin"].Object, From: req.From + 1_000_000}),
		"of a 3,500-byte name":  ask("t1", wire.ChunkRequest{Object: strings.Repeat("A", 3500)}),
	} {
		if len(m.Data) != 0 || m.Header.Get(wire.HeaderError) == "" {
			t.Errorf("a request %s: %d bytes, error %q; want an error and no bytes", name, len(m.Data), m.Header.Get(wire.HeaderError))
		}
	}
	if m := ask("t1", wire.ChunkRequest{Object: objects["out/a.bin"].Object}); len(m.Data) == 0 {
		t.Errorf("a request after the others: %q; want a chunk", m.Header.Get(wire.HeaderError))
	}

	// A flood, its answers to an inbox of its own.
	flood, _ := json.Marshal(wire.ChunkRequest{Object: objects["out/a.bin"].Object})
	busy, chunks := burst(t, nc, wire.SubjectFiles+".t1", flood, 2000, func() {
		if m := ask("t2", wire.ChunkRequest{Object: "executions/none"}); m.Header.Get(wire.HeaderError) == wire.Busy {
			t.Error("another tenant's request during the flood was answered busy")
		}
	})
	t.Logf("a flood of 2,000 requests: %d chunks, %d busy", chunks, busy)
	if busy == 0 {
		t.Error("a flood of 2,000 chunk requests was served in full; want the excess over the tenant's rate answered busy")
	}
}
