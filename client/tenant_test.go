package client_test

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/jazzmine/worker/client"
	"github.com/jazzmine/worker/wire"
)

// What an agent of a tenant asks the workers for (chunks of its artifacts, the
// catalog), against a fake worker that answers on the tenant's subjects as the
// workers do through the tenant's imports.

// chunkWorker answers chunk requests for one object of content, chunk bytes a
// chunk, after saying busy to the first busy requests; answer, if set, changes an
// answer before it is sent.
func chunkWorker(t *testing.T, nc *nats.Conn, content string, chunk, busy int, answer func(*nats.Msg)) *atomic.Int64 {
	t.Helper()
	var asked atomic.Int64
	sub, err := nc.Subscribe(wire.SubjectFiles, func(m *nats.Msg) {
		reply := &nats.Msg{Header: nats.Header{}}
		if asked.Add(1) <= int64(busy) {
			reply.Header.Set(wire.HeaderError, wire.Busy)
			_ = m.RespondMsg(reply)
			return
		}
		var r wire.ChunkRequest
		if err := json.Unmarshal(m.Data, &r); err != nil {
			t.Errorf("a chunk request that is not JSON: %q", m.Data)
		}
		from := min(int(r.From)*chunk, len(content)) // a chunk's sequence is its index here
		reply.Data = []byte(content[from:min(from+chunk, len(content))])
		reply.Header.Set(wire.HeaderObjectSize, strconv.Itoa(len(content)))
		reply.Header.Set(wire.HeaderNextChunk, strconv.Itoa(int(r.From)+1))
		if answer != nil {
			answer(reply)
		}
		_ = m.RespondMsg(reply)
	})
	if err := errors.Join(err, nc.Flush()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	return &asked
}

func tenantArtifact(content string) *client.Artifact {
	sum := sha256.Sum256([]byte(content))
	return &client.Artifact{Path: "out/a", Bucket: wire.TenantFilesBucket("t"), Object: "executions/t.x/1/files/out/a",
		Size: int64(len(content)), SHA256: hex.EncodeToString(sum[:])}
}

// TestATenantsDownloadAsksChunkAfterChunk: the client reads a tenant's artifact a
// chunk a request, asks again while the workers say busy, and checks what comes: a
// chunk past the object's size, an answer that makes no progress, or an error, ends
// the download with an error.
func TestATenantsDownloadAsksChunkAfterChunk(t *testing.T) {
	content := "abcdefghijklmnopq"
	t.Run("busy twice, then chunks", func(t *testing.T) {
		e := newEnv(t, client.Config{})
		asked := chunkWorker(t, e.nc, content, 4, 2, nil)
		var got strings.Builder
		if err := e.client.Download(ctx(t), tenantArtifact(content), &got); err != nil || got.String() != content {
			t.Fatalf("download: %q, %v", got.String(), err)
		}
		if n := asked.Load(); n != 2+5 {
			t.Errorf("%d requests, want 2 answered busy and 5 chunks", n)
		}
	})
	for name, tc := range map[string]struct {
		answer func(*nats.Msg)
		want   string
	}{
		"a chunk past the size": {func(m *nats.Msg) { m.Data = append(m.Data, "xxxxxxxxxxxxxxxxxxxxxx"...) }, "a chunk of"},
		"no progress":           {func(m *nats.Msg) { m.Header.Set(wire.HeaderNextChunk, "0") }, "no progress"},
		"an error":              {func(m *nats.Msg) { m.Data = nil; m.Header.Set(wire.HeaderError, "object gone") }, "object gone"},
		"the wrong bytes":       {func(m *nats.Msg) { m.Data = []byte(strings.ToUpper(string(m.Data))) }, "SHA-256"},
	} {
		t.Run(name, func(t *testing.T) {
			e := newEnv(t, client.Config{})
			chunkWorker(t, e.nc, content, 4, 0, tc.answer)
			var got strings.Builder
			if err := e.client.Download(ctx(t), tenantArtifact(content), &got); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("download: %v; want an error saying %q", err, tc.want)
			}
		})
	}
}

// TestATenantsSandboxesComeFromTheWorkers: where the workers answer on
// jazzmine.sandboxes (a tenant's account, which has no catalog bucket), Sandboxes
// takes their answer, asking again while they say busy.
func TestATenantsSandboxesComeFromTheWorkers(t *testing.T) {
	e := newEnv(t, client.Config{})
	var asked atomic.Int64
	sub, err := e.nc.Subscribe(wire.SubjectSandboxes, func(m *nats.Msg) {
		reply := &nats.Msg{Header: nats.Header{}}
		if asked.Add(1) == 1 {
			reply.Header.Set(wire.HeaderError, wire.Busy)
		} else {
			reply.Data = []byte(`[{"sandbox":"default","tools":[{"name":"add","signature":"(a)"}],"timeout_sec":30,"worker_id":"w","updated":"2026-01-01T00:00:00Z"}]`)
		}
		_ = m.RespondMsg(reply)
	})
	if err := errors.Join(err, e.nc.Flush()); err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	got, err := e.client.Sandboxes(ctx(t))
	if err != nil || len(got) != 1 || got[0].Sandbox != "default" || got[0].Tools[0].Name != "add" {
		t.Fatalf("Sandboxes: %+v, %v", got, err)
	}
	if asked.Load() != 2 {
		t.Errorf("%d requests, want one answered busy and one answered", asked.Load())
	}
}
