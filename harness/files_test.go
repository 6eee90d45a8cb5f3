package harness

import (
	"bytes"
	"context"
	"encoding/base64"
	"fmt"
	"io"
	"strings"
	"testing"

	"github.com/jazzmine/worker/wire"
)

// blobReader reads every blob the executor hands over, as a worker storing them would.
type blobReader struct {
	recorder
	blobs map[string][]byte
	errs  []error
}

func (b *blobReader) on(ctx context.Context, ev Event) error {
	if ev.Blob != nil {
		data, err := io.ReadAll(ev.Blob)
		if err != nil {
			b.errs = append(b.errs, err)
		}
		b.blobs[ev.Path] = data
	}
	return b.recorder.on(ctx, ev)
}

func chunk(id string, data []byte) string {
	return fmt.Sprintf(`{"type":"chunk","execution_id":%q,"data":%q}`, id, base64.StdEncoding.EncodeToString(data))
}

// TestExecutorHandsOverTheBytesOfArtifacts: an artifact's chunk lines become its
// Blob, which the callback reads while the executor waits; chunk lines do not count
// toward the output limit.
func TestExecutorHandsOverTheBytesOfArtifacts(t *testing.T) {
	f := newFake(t, 0)
	big := bytes.Repeat([]byte("a"), 3000)
	go func() {
		req := <-f.requests
		f.say(
			`{"type":"display","execution_id":"x","data":{"text/plain":"fig"},"path":"display/1.png","content_type":"image/png","size":4}`,
			chunk("x", []byte("\x89PNG")),
			`{"type":"artifact","execution_id":"x","path":"out/a.csv","size":3000,"content_type":"text/csv"}`,
			chunk("x", big[:1000]), chunk("x", big[1000:]),
			`{"type":"artifact","execution_id":"x","path":"out/empty","size":0}`,
			`{"type":"script_done","execution_id":"x","nonce":"`+req["nonce"].(string)+`"}`,
		)
	}()
	rec := &blobReader{blobs: map[string][]byte{}}
	var e Executor
	res, err := e.Run(context.Background(), f.conn, Request{ExecutionID: "x", Script: "s", Mode: ModeInteractive, MaxOutputBytes: 2000}, rec.on)
	if err != nil {
		t.Fatal(err)
	}
	if !res.Success || !res.Reusable || len(rec.errs) != 0 {
		t.Fatalf("result %+v, blob errors %v", res, rec.errs)
	}
	if string(rec.blobs["display/1.png"]) != "\x89PNG" || !bytes.Equal(rec.blobs["out/a.csv"], big) {
		t.Errorf("blobs %q", rec.blobs)
	}
	if got := strings.Join(rec.types(), " "); got != "display artifact artifact script_done" {
		t.Errorf("events %s", got)
	}
}

// TestExecutorRetiresAHarnessThatBreaksTheBlobProtocol: missing chunks, more bytes
// than announced, a chunk of another execution, and artifacts past the limits the
// harness was given are violations: the run is crashed, the container not reused.
func TestExecutorRetiresAHarnessThatBreaksTheBlobProtocol(t *testing.T) {
	for _, tc := range []struct {
		name  string
		lines func(nonce string) []string
		req   Request
	}{
		{"another line where a chunk is due", func(n string) []string {
			return []string{`{"type":"artifact","execution_id":"x","path":"out/a","size":4}`, `{"type":"final_result","execution_id":"x","data":1}`}
		}, Request{}},
		{"more bytes than announced", func(n string) []string {
			return []string{`{"type":"artifact","execution_id":"x","path":"out/a","size":2}`, chunk("x", []byte("abcd"))}
		}, Request{}},
		{"another execution's chunk", func(n string) []string {
			return []string{`{"type":"artifact","execution_id":"x","path":"out/a","size":2}`, chunk("y", []byte("ab"))}
		}, Request{}},
		{"more artifacts than the limit", func(n string) []string {
			return []string{`{"type":"artifact","execution_id":"x","path":"out/a","size":0}`, `{"type":"artifact","execution_id":"x","path":"out/b","size":0}`}
		}, Request{MaxArtifacts: 1}},
		{"more bytes than the limit", func(n string) []string {
			return []string{`{"type":"artifact","execution_id":"x","path":"out/a","size":11}`}
		}, Request{MaxArtifactBytes: 10}},
		{"a negative size", func(n string) []string {
			return []string{`{"type":"artifact","execution_id":"x","path":"out/a","size":-1}`}
		}, Request{}},
		// A path the host would make an object name of: one the harness never sends
		// (it caps them at 1,024 bytes), and which, in the name of the object's
		// description, made a protocol line the server refuses, closing the worker's
		// connection for good.
		{"an artifact path of 3,500 bytes", func(n string) []string {
			return []string{`{"type":"artifact","execution_id":"x","path":"out/` + strings.Repeat("a", 3500) + `","size":0}`}
		}, Request{}},
		{"an artifact path out of the workspace", func(n string) []string {
			return []string{`{"type":"artifact","execution_id":"x","path":"../etc/passwd","size":0}`}
		}, Request{}},
		{"a display image's path out of the workspace", func(n string) []string {
			return []string{`{"type":"display","execution_id":"x","path":"/display/1.png","size":0,"content_type":"image/png","data":{"text/plain":"x"}}`}
		}, Request{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFake(t, 0)
			go func() {
				req := <-f.requests
				f.say(tc.lines(req["nonce"].(string))...)
			}()
			rec := &blobReader{blobs: map[string][]byte{}}
			e := Executor{}
			req := tc.req
			req.ExecutionID, req.Script = "x", "s"
			res, err := e.Run(context.Background(), f.conn, req, rec.on)
			if err != nil {
				t.Fatal(err)
			}
			if res.Success || res.Reusable || res.Violation == "" || res.ErrorKind != wire.KindCrashed {
				t.Errorf("result %+v; want a crashed violation, not reusable", res)
			}
		})
	}
}

// TestExecutorSendsInputFilesBeforeTheExecute: each file is a file line and chunk
// lines of its bytes, in order, before the execute; a file that cannot be opened
// ends the run as input_file without an execute, and the container is not reused.
func TestExecutorSendsInputFilesBeforeTheExecute(t *testing.T) {
	f := newFake(t, 0)
	data := bytes.Repeat([]byte{0, 1, 2, 0xff}, ChunkBytes/4+10) // two chunks
	files := []InputFile{
		{Path: "a/b.bin", Mode: 0o600, Size: int64(len(data)), Open: func(context.Context) (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(data)), nil }},
		{Path: "empty", Size: 0, Open: func(context.Context) (io.ReadCloser, error) { return io.NopCloser(strings.NewReader("")), nil }},
	}
	got := make(chan []map[string]any, 1)
	go func() {
		var reqs []map[string]any
		for {
			req := <-f.requests
			reqs = append(reqs, req)
			if req["type"] == "execute" {
				got <- reqs
				f.say(`{"type":"script_done","execution_id":"x","nonce":"` + req["nonce"].(string) + `"}`)
				return
			}
		}
	}()
	var e Executor
	if _, err := e.Run(context.Background(), f.conn, Request{ExecutionID: "x", Script: "s", Mode: ModeInteractive, Files: files}, nil); err != nil {
		t.Fatal(err)
	}
	reqs := <-got
	var types []string
	var sent []byte
	for _, r := range reqs {
		types = append(types, r["type"].(string))
		if r["type"] == "chunk" {
			b, _ := base64.StdEncoding.DecodeString(r["data"].(string))
			sent = append(sent, b...)
		}
	}
	if strings.Join(types, " ") != "file chunk chunk file execute" {
		t.Errorf("requests %v", types)
	}
	if first := reqs[0]; first["path"] != "a/b.bin" || first["mode"] != float64(0o600) || first["size"] != float64(len(data)) {
		t.Errorf("file line %v", first)
	}
	if !bytes.Equal(sent, data) {
		t.Errorf("sent %d bytes, not the file's %d", len(sent), len(data))
	}

	f = newFake(t, 0)
	gone := []InputFile{{Path: "x", Size: 1, Open: func(context.Context) (io.ReadCloser, error) { return nil, fmt.Errorf("object gone") }}}
	res, err := e.Run(context.Background(), f.conn, Request{ExecutionID: "x", Script: "s", Files: gone}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if res.ErrorKind != wire.KindInputFile || res.Error != "input file x: object gone" || res.Reusable {
		t.Errorf("result %+v; want input_file, not reusable", res)
	}
}
