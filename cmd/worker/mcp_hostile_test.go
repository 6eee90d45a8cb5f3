package main

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jazzmine/worker/internal/testenv"
	"github.com/jazzmine/worker/internal/testworker"
	"github.com/jazzmine/worker/sandboxpool"
	"github.com/jazzmine/worker/wire"
)

// TestMCPRefusesHostileCallsAndLeavesNothingBehind plays a hostile MCP client over
// streamable HTTP: path traversal in files, invalid sandbox names and session ids, a
// large base64 file and malformed base64; each must be an error of the call, and the
// server must still serve the next call. Files too large for the job are uploaded to
// the fleet's files bucket: a refused call leaves none there (the whole call is
// checked first), and neither does a call once its execution has ended.
func TestMCPRefusesHostileCallsAndLeavesNothingBehind(t *testing.T) {
	srv, nc := testenv.NATS(t)
	testworker.Start(t, nc, testworker.Options{Sandbox: sandboxpool.Sandbox{PoolSize: 1, MaxOverflow: 1}})
	tr := mcpTransports[1] // HTTP
	c := dial(t, tr, srv.ClientURL())
	callErr := func(what string, name string, args map[string]any) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		res, err := c.cs.CallTool(ctx, &mcp.CallToolParams{Name: name, Arguments: args})
		switch {
		case err != nil:
			t.Logf("%s: protocol error: %v", what, err)
		case res.IsError:
			t.Logf("%s: refused: %s", what, strings.TrimSpace(textOf(res)))
		default:
			t.Errorf("%s: accepted: %s", what, textOf(res))
		}
	}
	for _, p := range []string{"../escape.txt", "/etc/passwd", "a/../../x", "out/../../../tmp/x", "..", ".", "a//b", "a\x00b"} {
		callErr("file path "+p, "run_python", map[string]any{"script": "emit_result(1)", "files": []map[string]any{{"path": p, "text": "x"}}})
	}
	for _, sb := range []string{"../default", "default.x", "*", ">", "a b", strings.Repeat("a", 5000), "default\n"} {
		callErr("run_python sandbox "+short(sb, 20), "run_python", map[string]any{"script": "emit_result(1)", "sandbox": sb})
		callErr("open_session sandbox "+short(sb, 20), "open_session", map[string]any{"sandbox": sb})
	}
	for _, id := range []string{"../x", "*", ">", "x.y", ""} {
		callErr("run_python session_id "+id, "run_python", map[string]any{"script": "emit_result(1)", "session_id": id + "z"})
		callErr("close_session "+id, "close_session", map[string]any{"session_id": id})
	}
	callErr("malformed base64", "run_python", map[string]any{"script": "emit_result(1)", "files": []map[string]any{{"path": "b", "base64": "!!!"}}})
	callErr("text and base64", "run_python", map[string]any{"script": "emit_result(1)", "files": []map[string]any{{"path": "b", "base64": "AA==", "text": "x"}}})
	callErr("negative timeout", "run_python", map[string]any{"script": "emit_result(1)", "timeout_sec": -1})

	// Large files (uploaded to the files bucket) followed by one the job refuses, or
	// for a sandbox no worker serves: nothing may be left behind.
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	store, err := js.ObjectStore(ctx, wire.FilesBucket)
	if err != nil {
		t.Fatalf("the files bucket: %v", err)
	}
	count := func() int {
		t.Helper()
		list, err := store.List(ctx)
		if err != nil && !errors.Is(err, jetstream.ErrNoObjectsFound) {
			t.Fatalf("list %s: %v", wire.FilesBucket, err)
		}
		n := 0
		for _, o := range list {
			if strings.HasPrefix(o.Name, "uploads/") {
				n++
			}
		}
		return n
	}
	before := count()
	// The count sees an upload: the checks below are not vacuous.
	if _, err := store.PutBytes(ctx, "uploads/probe/x", []byte("x")); err != nil {
		t.Fatal(err)
	}
	if got := count(); got != before+1 {
		t.Fatalf("%d uploads counted after one was put, want %d", got, before+1)
	}
	if err := store.Delete(ctx, "uploads/probe/x"); err != nil {
		t.Fatal(err)
	}
	big := base64.StdEncoding.EncodeToString(make([]byte, 100<<10))
	files := []map[string]any{}
	for range 5 {
		files = append(files, map[string]any{"path": "big" + string(rune('a'+len(files))), "base64": big})
	}
	files = append(files, map[string]any{"path": "../bad", "text": "x"})
	callErr("large uploads then a bad path", "run_python", map[string]any{"script": "emit_result(1)", "files": files})
	files = files[:5]
	callErr("large uploads to a sandbox that does not exist", "run_python", map[string]any{"script": "emit_result(1)", "sandbox": "nosuch", "files": files})
	if after := count(); after > before {
		t.Errorf("refused run_python calls left %d uploads (100 KiB each) in %s", after-before, wire.FilesBucket)
	}
	// A call that ran: the script read its large files, which are gone afterwards.
	res := c.call(t, "run_python", map[string]any{"files": files,
		"script": "import os\nemit_result(sum(os.path.getsize(f) for f in os.listdir('.') if f.startswith('big')))"})
	if res.IsError || !strings.Contains(textOf(res), fmt.Sprint(5*100<<10)) {
		t.Fatalf("a run with five 100 KiB files: %s", textOf(res))
	}
	if after := count(); after > before {
		t.Errorf("a run_python call that ended left %d uploads in %s", after-before, wire.FilesBucket)
	}

	// A large base64 file (32 MiB decoded): the server must survive.
	huge := base64.StdEncoding.EncodeToString(make([]byte, 32<<20))
	callCtx, ccancel := context.WithTimeout(context.Background(), 3*time.Minute)
	res, err = c.cs.CallTool(callCtx, &mcp.CallToolParams{Name: "run_python", Arguments: map[string]any{
		"script": "import os\nemit_result(os.path.getsize('huge.bin'))", "files": []map[string]any{{"path": "huge.bin", "base64": huge}}}})
	ccancel()
	if err != nil {
		t.Logf("32 MiB file: protocol error %v", err)
	} else if !res.IsError {
		t.Logf("32 MiB file: ran: %s", short(textOf(res), 300))
	} else {
		t.Logf("32 MiB file: refused: %s", short(textOf(res), 300))
	}

	// Still serving (a new conversation: the SDK's client closes its own after a 413).
	c = dial(t, tr, srv.ClientURL())
	if res := c.call(t, "run_python", map[string]any{"script": "emit_result(7)"}); res.IsError {
		t.Errorf("the server no longer serves after the hostile calls: %s", textOf(res))
	}
}

// bearerTransport adds a bearer token to every request.
type bearerTransport struct {
	token string
	base  http.RoundTripper
}

func (b bearerTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return b.base.RoundTrip(r)
}

// TestMCPOverHTTPNeedsItsToken: off loopback the HTTP endpoint will not start without
// a secret, and with --token-file a request without it, or with another, is refused
// before any MCP: only a client with the secret lists the tools.
func TestMCPOverHTTPNeedsItsToken(t *testing.T) {
	srv, _ := testenv.NATS(t)
	env := func(k string) string {
		if k == "NATS_URL" {
			return srv.ClientURL()
		}
		return ""
	}
	dir := t.TempDir()
	short, good := filepath.Join(dir, "short"), filepath.Join(dir, "token")
	secret := strings.Repeat("s3cr3t-", 6)
	if err := os.WriteFile(short, []byte("tiny\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(good, []byte(secret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--http", "0.0.0.0:0"}, "not on loopback: give --token-file"},
		{[]string{"--http", ":0"}, "not on loopback: give --token-file"},
		{[]string{"--http", "127.0.0.1:0", "--token-file", short}, "a secret needs 16 or more"},
		{[]string{"--http", "127.0.0.1:0", "--token-file", filepath.Join(dir, "none")}, "no such file"},
		{[]string{"--token-file", good}, "--token-file is for --http"},
	} {
		var stderr strings.Builder
		err := run(context.Background(), append([]string{"mcp"}, c.args...), env, strings.NewReader(""), io.Discard, &stderr)
		var ee *exitError
		if !errors.As(err, &ee) || ee.code != 2 || !strings.Contains(err.Error(), c.want) {
			t.Errorf("worker mcp %v: %v (stderr %q); want a usage error saying %q", c.args, err, stderr.String(), c.want)
		}
	}

	u := startMCPHTTP(t, srv.ClientURL(), "--token-file", good)
	body := `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"x","version":"1"}}}`
	for _, auth := range []string{"", "Bearer wrong-secret-of-enough-length", "Bearer " + secret[:len(secret)-1], "Basic " + secret} {
		req, _ := http.NewRequest(http.MethodPost, u, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("a request with Authorization %q: %s, want 401", auth, resp.Status)
		}
	}
	httpClient := &http.Client{Transport: bearerTransport{token: secret, base: &http.Transport{}}}
	t.Cleanup(httpClient.CloseIdleConnections)
	cs := connectClient(t, &mcp.StreamableClientTransport{Endpoint: u, HTTPClient: httpClient}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	tools, err := cs.ListTools(ctx, nil)
	if err != nil || len(tools.Tools) == 0 {
		t.Fatalf("with the secret: tools %+v, %v", tools, err)
	}
}
