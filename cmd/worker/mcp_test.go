package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"image/png"
	"io"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jazzmine/worker/internal/testenv"
	"github.com/jazzmine/worker/internal/testworker"
	"github.com/jazzmine/worker/sandboxpool"
	"github.com/jazzmine/worker/wire"
	"github.com/jazzmine/worker/worker"
)

// mcpConn is an MCP client session with `worker mcp`, and the progress notifications
// it received.
type mcpConn struct {
	cs       *mcp.ClientSession
	progress chan *mcp.ProgressNotificationParams
}

// mcpTransport starts `worker mcp` against the NATS server at natsURL and connects
// the Go SDK's client to it; the server stops at the end of the test.
type mcpTransport struct {
	name    string
	connect func(t *testing.T, natsURL string, opts *mcp.ClientOptions) *mcp.ClientSession
}

var mcpTransports = []mcpTransport{{"stdio", connectStdio}, {"HTTP", connectHTTP}}

// connectStdio runs the worker binary's `mcp` as a process, over its stdin and stdout.
func connectStdio(t *testing.T, natsURL string, opts *mcp.ClientOptions) *mcp.ClientSession {
	cmd := exec.Command(testenv.WorkerBinary(t), "mcp", "--timeout", "20s")
	cmd.Env = append(os.Environ(), "NATS_URL="+natsURL)
	var stderr lockedBuffer
	cmd.Stderr = &stderr
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("worker mcp's stderr:\n%s", stderr.String())
		}
	})
	return connectClient(t, &mcp.CommandTransport{Command: cmd}, opts)
}

// connectHTTP runs `worker mcp --http 127.0.0.1:0` in the test's process and connects
// to the address it announces on stderr.
func connectHTTP(t *testing.T, natsURL string, opts *mcp.ClientOptions) *mcp.ClientSession {
	u := startMCPHTTP(t, natsURL)
	httpClient := &http.Client{Transport: &http.Transport{}}
	t.Cleanup(httpClient.CloseIdleConnections) // before the server stops: cleanups run last first
	return connectClient(t, &mcp.StreamableClientTransport{Endpoint: u, HTTPClient: httpClient}, opts)
}

// startMCPHTTP runs `worker mcp --http 127.0.0.1:0` with args in the test's process,
// stopped at cleanup, and returns its endpoint's URL.
func startMCPHTTP(t *testing.T, natsURL string, args ...string) string {
	ctx, stop := context.WithCancel(context.Background())
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	env := func(k string) string {
		if k == "NATS_URL" {
			return natsURL
		}
		return ""
	}
	go func() {
		done <- run(ctx, append([]string{"mcp", "--http", "127.0.0.1:0", "--timeout", "20s"}, args...), env, strings.NewReader(""), io.Discard, pw)
		pw.Close()
	}()
	url := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			if m := regexp.MustCompile(`http://\S+`).FindString(sc.Text()); m != "" {
				url <- m
			}
			t.Log(sc.Text())
		}
	}()
	t.Cleanup(func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("worker mcp --http: %v", err)
		}
	})
	select {
	case u := <-url:
		return u
	case err := <-done:
		t.Fatalf("worker mcp --http ended: %v", err)
	case <-time.After(time.Minute):
		t.Fatal("worker mcp --http announced no address")
	}
	return ""
}

func connectClient(t *testing.T, tr mcp.Transport, opts *mcp.ClientOptions) *mcp.ClientSession {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "jazzmine-test", Version: "1"}, opts).Connect(ctx, tr, nil)
	if err != nil {
		t.Fatalf("connect to worker mcp: %v", err)
	}
	t.Cleanup(func() { _ = cs.Close() })
	return cs
}

// dial connects a new conversation over tr.
func dial(t *testing.T, tr mcpTransport, natsURL string) *mcpConn {
	c := &mcpConn{progress: make(chan *mcp.ProgressNotificationParams, 1000)}
	c.cs = tr.connect(t, natsURL, &mcp.ClientOptions{ProgressNotificationHandler: func(_ context.Context, req *mcp.ProgressNotificationClientRequest) {
		select {
		case c.progress <- req.Params:
		default:
		}
	}})
	return c
}

// call calls a tool and fails the test on a protocol error.
func (c *mcpConn) call(t *testing.T, name string, args any) *mcp.CallToolResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	res, err := c.cs.CallTool(ctx, &mcp.CallToolParams{Name: name, Arguments: args})
	if err != nil {
		t.Fatalf("call %s: %v", name, err)
	}
	return res
}

// textOf joins the text contents of a result.
func textOf(res *mcp.CallToolResult) string {
	var b strings.Builder
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			b.WriteString(tc.Text + "\n")
		}
	}
	return b.String()
}

// structured decodes a result's structured content into a T.
func structured[T any](t *testing.T, res *mcp.CallToolResult) T {
	t.Helper()
	var v T
	b, err := json.Marshal(res.StructuredContent)
	if err == nil {
		err = json.Unmarshal(b, &v)
	}
	if err != nil {
		t.Fatalf("structured content %s: %v", b, err)
	}
	return v
}

// TestMCPServesTheFleet runs `worker mcp` over stdio and over streamable HTTP against a
// real worker, and uses it with the Go SDK's own MCP client, as an MCP host would.
func TestMCPServesTheFleet(t *testing.T) {
	srv, nc := testenv.NATS(t)
	testworker.Start(t, nc, testworker.Options{Sandbox: sandboxpool.Sandbox{PoolSize: 1, MaxOverflow: 3}})
	for _, tr := range mcpTransports {
		t.Run(tr.name, func(t *testing.T) {
			c := dial(t, tr, srv.ClientURL())
			t.Run("the tool list has run_python, list_sandboxes and the session tools", func(t *testing.T) { testToolList(t, c) })
			t.Run("a run returns its result and output", func(t *testing.T) { testRunResult(t, c) })
			t.Run("plain calls keep the conversation's state, not another's", func(t *testing.T) { testStateKept(t, c, tr, srv.ClientURL()) })
			t.Run("long output is cut to its head and tail, the whole a resource", func(t *testing.T) { testCut(t, c) })
			t.Run("an exception is an error result with its traceback", func(t *testing.T) { testException(t, c) })
			t.Run("a script past its timeout is a timeout error", func(t *testing.T) { testTimeout(t, c) })
			t.Run("events arrive as progress while the script runs", func(t *testing.T) { testProgress(t, c, nc) })
			t.Run("a cancelled call cancels the job on the fleet", func(t *testing.T) { testCancel(t, c, nc) })
			t.Run("a displayed image comes back as image content", func(t *testing.T) { testImage(t, c) })
			t.Run("list_sandboxes shows each tool's signature and docstring", func(t *testing.T) { testListSandboxes(t, c) })
			t.Run("a session keeps state across calls and closes", func(t *testing.T) { testSession(t, c, tr, srv.ClientURL(), nc) })
			t.Run("a session lost on the fleet is replaced by the next open_session", func(t *testing.T) { testLostSession(t, c) })
		})
	}
}

// TestMCPServesATenant runs `worker mcp --nkey` with a tenant's credentials, on a
// server with the accounts `worker nats-auth` renders: the tenant's account reaches
// the fleet only through its imports. The catalog, a displayed image and an artifact
// (the workers' chunk service) and a session that keeps its state all work.
func TestMCPServesATenant(t *testing.T) {
	url, workerSeed, seeds := testenv.TenantsNATS(t, "acme")
	wnc := testenv.ConnectSeed(t, url, workerSeed, nil)
	testworker.Start(t, wnc, testworker.Options{Sandbox: sandboxpool.Sandbox{PoolSize: 1, MaxOverflow: 2}})
	httpClient := &http.Client{Transport: &http.Transport{}}
	u := startMCPHTTP(t, url, "--nkey", seeds["acme"])
	t.Cleanup(httpClient.CloseIdleConnections)
	c := &mcpConn{progress: make(chan *mcp.ProgressNotificationParams, 1000)}
	c.cs = connectClient(t, &mcp.StreamableClientTransport{Endpoint: u, HTTPClient: httpClient}, nil)

	t.Run("list_sandboxes shows each tool's signature and docstring", func(t *testing.T) { testListSandboxes(t, c) })
	t.Run("a displayed image comes back as image content", func(t *testing.T) { testImage(t, c) })
	t.Run("a file too large for the job goes up to the tenant's own bucket", func(t *testing.T) {
		big := base64.StdEncoding.EncodeToString(bytes.Repeat([]byte("acme "), 60_000)) // 300 kB: past a job's 256 KiB
		res := c.call(t, "run_python", map[string]any{"files": []map[string]any{{"path": "big.txt", "base64": big}},
			"script": "emit_result(open('big.txt').read().count('acme'))"})
		if out := structured[runOutput](t, res); res.IsError || out.Result != float64(60_000) {
			t.Errorf("a run with a 300 kB file: %s", textOf(res))
		}
	})
	t.Run("a session keeps state across calls and closes", func(t *testing.T) {
		opened := structured[sessionOutput](t, c.call(t, "open_session", map[string]any{}))
		if res := c.call(t, "run_python", map[string]any{"script": "x = 41", "session_id": opened.SessionID}); res.IsError {
			t.Fatalf("first call: %s", textOf(res))
		}
		res := c.call(t, "run_python", map[string]any{"script": "emit_result(x + 1)", "session_id": opened.SessionID})
		if out := structured[runOutput](t, res); out.Result != float64(42) {
			t.Errorf("second call: %+v, want 42 from the first call's x", out)
		}
		if closed := structured[sessionOutput](t, c.call(t, "close_session", map[string]any{"session_id": opened.SessionID})); !closed.Closed {
			t.Errorf("close_session: %+v", closed)
		}
		// In the fleet's account the session is the tenant's: acme.<id>.
		testenv.WaitFor(t, 30*time.Second, "the closed session to end on the fleet", func() bool {
			return sessionState(t, wnc, "acme."+opened.SessionID) == "ended"
		})
	})
}

func testToolList(t *testing.T, c *mcpConn) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	list, err := c.cs.ListTools(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	tools := map[string]*mcp.Tool{}
	for _, tool := range list.Tools {
		tools[tool.Name] = tool
	}
	for _, name := range []string{"run_python", "list_sandboxes", "open_session", "close_session"} {
		if tools[name] == nil || tools[name].Description == "" {
			t.Errorf("tool %s missing or undescribed in %v", name, list.Tools)
		}
	}
	if len(tools) != 4 {
		t.Errorf("%d tools, want 4", len(tools))
	}
	schema, _ := json.Marshal(tools["run_python"].InputSchema)
	for _, want := range []string{`"required":["script"]`, `"timeout_sec"`, `"session_id"`, `"base64"`} {
		if !strings.Contains(string(schema), want) {
			t.Errorf("run_python's input schema lacks %s: %s", want, schema)
		}
	}
	init := c.cs.InitializeResult()
	if init == nil || !strings.Contains(init.Instructions, "emit_result") {
		t.Fatalf("the server's instructions do not tell a model about emit_result: %+v", init)
	}
	t.Logf("protocol version %s", init.ProtocolVersion)
}

func testRunResult(t *testing.T, c *mcpConn) {
	res := c.call(t, "run_python", map[string]any{
		"script": "print('hello from the sandbox')\nemit_result({'words': word_count(open('in/notes.txt').read()), 'raw': len(open('b.bin', 'rb').read())})",
		"files":  []map[string]any{{"path": "in/notes.txt", "text": "one two three"}, {"path": "b.bin", "base64": "AAEC"}},
	})
	if res.IsError {
		t.Fatalf("an error result: %s", textOf(res))
	}
	out := structured[runOutput](t, res)
	if result, _ := json.Marshal(out.Result); !out.Success || string(result) != `{"raw":3,"words":3}` || out.Stdout != "hello from the sandbox\n" || out.ExecutionID == "" {
		t.Errorf("structured output %+v", out)
	}
	for _, want := range []string{`result: {"raw":3,"words":3}`, "stdout:\nhello from the sandbox", "success"} {
		if !strings.Contains(textOf(res), want) {
			t.Errorf("the text lacks %q:\n%s", want, textOf(res))
		}
	}
}

func testStateKept(t *testing.T, c *mcpConn, tr mcpTransport, natsURL string) {
	if res := c.call(t, "run_python", map[string]any{"script": "x = 41\nimport math"}); res.IsError {
		t.Fatalf("first call: %s", textOf(res))
	}
	res := c.call(t, "run_python", map[string]any{"script": "x + 1"})
	out := structured[runOutput](t, res)
	if res.IsError || out.Out["text/plain"] != "42" || out.SessionID == "" || out.Result != nil {
		t.Fatalf("second call: %s, want Out 42 from the first call's x (and no second copy as the result)", textOf(res))
	}
	first := strings.SplitN(textOf(res), "\n", 2)[0]
	if !strings.Contains(textOf(res), fmt.Sprintf("Out[%d]: 42\n", out.ExecutionCount)) || out.ExecutionCount < 2 ||
		!strings.Contains(first, "CPU ") || !strings.Contains(first, "peak memory ") || !strings.Contains(first, out.SessionID) {
		t.Errorf("the text does not show Out as IPython does, or its first line what the run cost:\n%s", textOf(res))
	}
	other := dial(t, tr, natsURL)
	res = other.call(t, "run_python", map[string]any{"script": "x"})
	if o := structured[runOutput](t, res); !res.IsError || o.Error != "NameError: name 'x' is not defined" || o.SessionID == out.SessionID {
		t.Errorf("another conversation's call: %s, want its own session, where x is not defined", textOf(res))
	}
}

func testCut(t *testing.T, c *mcpConn) {
	res := c.call(t, "run_python", map[string]any{"script": "for i in range(100_000):\n    print(i)"})
	out := structured[runOutput](t, res)
	var whole strings.Builder
	for i := range 100_000 {
		fmt.Fprintf(&whole, "%d\n", i)
	}
	if res.IsError || len(out.Cut) != 1 || out.Cut[0].Field != "stdout" || out.Cut[0].Lines != 100_000-2*cutLines {
		t.Fatalf("result %s, cut %+v: want stdout cut", textOf(res), out.Cut)
	}
	uri := out.Cut[0].URI
	marker := fmt.Sprintf("\n59\n… %d lines (%d bytes) left out … (the whole: %s)\n99940\n", 100_000-2*cutLines, out.Cut[0].Bytes, uri)
	if !strings.Contains(textOf(res), marker) || !strings.HasSuffix(strings.TrimSpace(out.Stdout), "99999") || !strings.HasPrefix(out.Stdout, "0\n1\n") {
		t.Errorf("the text lacks %q:\n%.2000s", marker, textOf(res))
	}
	if b, _ := json.Marshal(res.StructuredContent); len(b) > 3*cutBytes {
		t.Errorf("the structured content holds %d bytes: the output twice?", len(b))
	}
	var link *mcp.ResourceLink
	for _, content := range res.Content {
		if l, ok := content.(*mcp.ResourceLink); ok {
			link = l
		}
	}
	if link == nil || link.URI != uri || *link.Size != int64(whole.Len()) {
		t.Fatalf("no resource link to the whole stdout: %+v", link)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	read, err := c.cs.ReadResource(ctx, &mcp.ReadResourceParams{URI: uri})
	if err != nil || len(read.Contents) != 1 || read.Contents[0].Text != whole.String() {
		t.Fatalf("read %s: %v, want the whole stdout", uri, err)
	}
	// What the conversation was not named is not found, whatever the bucket holds.
	if _, err := c.cs.ReadResource(ctx, &mcp.ReadResourceParams{URI: strings.Replace(uri, "stdout", "stderr", 1)}); err == nil {
		t.Error("read an object no result named")
	}
}

func testException(t *testing.T, c *mcpConn) {
	res := c.call(t, "run_python", map[string]any{"script": "def f():\n    return 1 / 0\nf()"})
	out := structured[runOutput](t, res)
	if !res.IsError || out.Success || out.ErrorKind != wire.KindScript {
		t.Errorf("IsError %v, output %+v: want a script error", res.IsError, out)
	}
	for _, want := range []string{"ZeroDivisionError", "Traceback (most recent call last)", "in f"} {
		if !strings.Contains(textOf(res), want) {
			t.Errorf("the text lacks %q:\n%s", want, textOf(res))
		}
	}
}

func testTimeout(t *testing.T, c *mcpConn) {
	res := c.call(t, "run_python", map[string]any{"script": "import time\ntime.sleep(60)", "timeout_sec": 1})
	out := structured[runOutput](t, res)
	if !res.IsError || out.ErrorKind != wire.KindTimeout {
		t.Errorf("IsError %v, output %+v: want a timeout", res.IsError, out)
	}
	if !strings.Contains(textOf(res), "failed (timeout)") {
		t.Errorf("the text does not say it timed out:\n%s", textOf(res))
	}
}

// startedID matches the execution id in the progress notification of a start.
var startedID = regexp.MustCompile(`^execution (\S+) started on worker`)

// callAsync calls run_python with a progress token in the background.
func (c *mcpConn) callAsync(ctx context.Context, args map[string]any) <-chan *mcp.CallToolResult {
	for len(c.progress) > 0 { // an earlier call's
		<-c.progress
	}
	params := &mcp.CallToolParams{Name: "run_python", Arguments: args}
	params.SetProgressToken("tok-" + time.Now().Format("150405.000000"))
	done := make(chan *mcp.CallToolResult, 1)
	go func() {
		res, _ := c.cs.CallTool(ctx, params)
		done <- res
	}()
	return done
}

// nextProgress waits for the next progress notification whose message matches.
func (c *mcpConn) nextProgress(t *testing.T, match string) string {
	t.Helper()
	timeout := time.After(time.Minute)
	for {
		select {
		case p := <-c.progress:
			if strings.Contains(p.Message, match) {
				return p.Message
			}
		case <-timeout:
			t.Fatalf("no progress notification with %q", match)
		}
	}
}

// lastEvent reads the last event of an execution of that type from the events stream.
func lastEvent(t *testing.T, nc *nats.Conn, id, typ string) (*wire.Event, bool) {
	t.Helper()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	stream, err := js.Stream(ctx, wire.StreamEvents)
	if err != nil {
		t.Fatal(err)
	}
	msg, err := stream.GetLastMsgForSubject(ctx, wire.EventSubject(id, typ))
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return nil, false
	}
	if err != nil {
		t.Fatal(err)
	}
	ev, err := wire.DecodeEvent(msg.Header.Get(wire.HeaderContentType), msg.Data)
	if err != nil {
		t.Fatal(err)
	}
	return ev, true
}

func testProgress(t *testing.T, c *mcpConn, nc *nats.Conn) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	done := c.callAsync(ctx, map[string]any{"script": "import time\nprint('first line')\nemit_intermediate('step', {'i': 1})\nemit_log('halfway')\ntime.sleep(3)\nemit_result('done')"})
	id := startedID.FindStringSubmatch(c.nextProgress(t, "started on worker"))[1]
	for _, want := range []string{"stdout: first line", `intermediate step: {"i":1}`, "log info: halfway"} {
		c.nextProgress(t, want)
	}
	// The script still runs: the fleet has no end of it yet, and the call no result.
	if _, ended := lastEvent(t, nc, id, wire.EventScriptDone); ended {
		t.Error("the progress came after the script ended")
	}
	select {
	case <-done:
		t.Fatal("the call returned before the script ended")
	default:
	}
	res := <-done
	if res == nil || res.IsError || structured[runOutput](t, res).Result != "done" {
		t.Fatalf("result %+v", res)
	}
}

func testCancel(t *testing.T, c *mcpConn, nc *nats.Conn) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := c.callAsync(ctx, map[string]any{"script": "import time\nemit_intermediate('looping', 1)\nwhile True:\n    time.sleep(0.05)"})
	id := startedID.FindStringSubmatch(c.nextProgress(t, "started on worker"))[1]
	c.nextProgress(t, "intermediate looping")
	cancel()
	<-done
	var end *wire.Event
	testenv.WaitFor(t, time.Minute, "the execution's end on the fleet", func() bool {
		ev, ok := lastEvent(t, nc, id, wire.EventScriptDone)
		end = ev
		return ok
	})
	failure, _ := lastEvent(t, nc, id, wire.EventError)
	if end.Success || failure == nil || failure.Kind != wire.KindCancelled {
		t.Errorf("the execution ended with %+v, error %+v: want it cancelled", end, failure)
	}
}

// redPNG is a script's object that displays as a 3x2 red PNG, made with the stdlib.
const redPNG = `import struct, zlib
def png(w, h):
    raw = b"".join(b"\x00" + b"\xff\x00\x00" * w for _ in range(h))
    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)) + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b"")
class Red:
    def _repr_png_(self):
        return png(3, 2)
    def __repr__(self):
        return "a red rectangle"
display(Red())
import os
os.makedirs("out")
open("out/table.csv", "w").write("a,b\n1,2\n")
emit_result("shown")
`

func testImage(t *testing.T, c *mcpConn) {
	res := c.call(t, "run_python", map[string]any{"script": redPNG})
	if res.IsError {
		t.Fatalf("an error result: %s", textOf(res))
	}
	var img *mcp.ImageContent
	var csv *mcp.EmbeddedResource
	for _, content := range res.Content {
		switch v := content.(type) {
		case *mcp.ImageContent:
			img = v
		case *mcp.EmbeddedResource:
			csv = v
		}
	}
	if img == nil || img.MIMEType != "image/png" {
		t.Fatalf("no PNG image content in %s", textOf(res))
	}
	decoded, err := png.Decode(bytes.NewReader(img.Data))
	if err != nil {
		t.Fatal(err)
	}
	if b := decoded.Bounds(); b.Dx() != 3 || b.Dy() != 2 {
		t.Errorf("the image is %v, want 3x2", b)
	}
	if r, g, _, _ := decoded.At(1, 1).RGBA(); r != 0xffff || g != 0 {
		t.Errorf("pixel (1,1) = %v, want red", decoded.At(1, 1))
	}
	if csv == nil || csv.Resource.Text != "a,b\n1,2\n" || csv.Resource.MIMEType != "text/csv" {
		t.Errorf("the artifact out/table.csv is not embedded as text/csv: %+v", csv)
	}
	if !strings.Contains(textOf(res), "display 1: a red rectangle") {
		t.Errorf("the text does not say what was displayed:\n%s", textOf(res))
	}
}

func testListSandboxes(t *testing.T, c *mcpConn) {
	res := c.call(t, "list_sandboxes", map[string]any{})
	if res.IsError {
		t.Fatalf("an error result: %s", textOf(res))
	}
	out := structured[sandboxesOutput](t, res)
	if len(out.Sandboxes) != 1 || out.Sandboxes[0].Sandbox != "default" {
		t.Fatalf("sandboxes %+v, want default", out.Sandboxes)
	}
	want := wire.ToolSpec{Name: "top_words", Signature: "(text: str, n: int = 3) -> list[dict]", Doc: "Returns the n most frequent words of text (lower-cased) with their counts."}
	found := false
	for _, tool := range out.Sandboxes[0].Tools {
		found = found || tool == want
	}
	if !found {
		t.Errorf("tools %+v lack %+v", out.Sandboxes[0].Tools, want)
	}
	for _, line := range []string{"def top_words(text: str, n: int = 3) -> list[dict]", "Returns the n most frequent words", "no network"} {
		if !strings.Contains(textOf(res), line) {
			t.Errorf("the text lacks %q:\n%s", line, textOf(res))
		}
	}
}

// sessionState is a session's state in the fleet's sessions bucket.
func sessionState(t *testing.T, nc *nats.Conn, id string) string {
	t.Helper()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	kv, err := js.KeyValue(ctx, worker.BucketSessions)
	if err != nil {
		t.Fatal(err)
	}
	entry, err := kv.Get(ctx, id)
	if err != nil {
		return "none"
	}
	var e struct {
		State string `json:"state"`
	}
	_ = json.Unmarshal(entry.Value(), &e)
	return e.State
}

func testSession(t *testing.T, c *mcpConn, tr mcpTransport, natsURL string, nc *nats.Conn) {
	opened := structured[sessionOutput](t, c.call(t, "open_session", map[string]any{}))
	if again := structured[sessionOutput](t, c.call(t, "open_session", map[string]any{"sandbox": "default"})); again.SessionID != opened.SessionID {
		t.Errorf("a second open_session gave %s, want the conversation's %s", again.SessionID, opened.SessionID)
	}
	if res := c.call(t, "run_python", map[string]any{"script": "x = 41", "session_id": opened.SessionID}); res.IsError {
		t.Fatalf("first call: %s", textOf(res))
	}
	res := c.call(t, "run_python", map[string]any{"script": "emit_result(x + 1)", "session_id": opened.SessionID})
	if out := structured[runOutput](t, res); out.Result != float64(42) || out.SessionID != opened.SessionID {
		t.Errorf("second call: %+v, want 42 from the first call's x", out)
	}

	other := dial(t, tr, natsURL) // another conversation may not use it
	if res := other.call(t, "run_python", map[string]any{"script": "emit_result(x)", "session_id": opened.SessionID}); !res.IsError {
		t.Errorf("another conversation ran in the session: %s", textOf(res))
	}
	if closed := structured[sessionOutput](t, c.call(t, "close_session", map[string]any{"session_id": opened.SessionID})); !closed.Closed {
		t.Errorf("close_session: %+v", closed)
	}
	// The worker marks it ended once its close call has answered.
	testenv.WaitFor(t, 30*time.Second, "the closed session to end on the fleet", func() bool {
		return sessionState(t, nc, opened.SessionID) == "ended"
	})
	if res := c.call(t, "run_python", map[string]any{"script": "emit_result(x)", "session_id": opened.SessionID}); !res.IsError || !strings.Contains(textOf(res), "not open") {
		t.Errorf("a call of the closed session: %s", textOf(res))
	}

	// The end of a conversation closes its session.
	left := structured[sessionOutput](t, other.call(t, "open_session", map[string]any{}))
	if err := other.cs.Close(); err != nil {
		t.Logf("close the other conversation: %v", err)
	}
	testenv.WaitFor(t, time.Minute, "the session of the conversation that ended to end", func() bool {
		return sessionState(t, nc, left.SessionID) == "ended"
	})
}

func testLostSession(t *testing.T, c *mcpConn) {
	lost := structured[sessionOutput](t, c.call(t, "open_session", map[string]any{}))
	c.call(t, "run_python", map[string]any{"script": "import os\nos._exit(3)", "session_id": lost.SessionID})
	res := c.call(t, "run_python", map[string]any{"script": "emit_result(1)", "session_id": lost.SessionID})
	if out := structured[runOutput](t, res); !res.IsError || out.ErrorKind != wire.KindSessionLost {
		t.Errorf("a call after the session's process died: %+v, want session_lost", out)
	}
	next := structured[sessionOutput](t, c.call(t, "open_session", map[string]any{}))
	if next.SessionID == lost.SessionID {
		t.Errorf("open_session gave the lost session %s again", lost.SessionID)
	}
	if res := c.call(t, "run_python", map[string]any{"script": "emit_result(2)", "session_id": next.SessionID}); res.IsError {
		t.Errorf("a call of the new session: %s", textOf(res))
	}
	c.call(t, "close_session", map[string]any{"session_id": next.SessionID})
}

// lockedBuffer is a bytes.Buffer safe for a writer and a reader.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
