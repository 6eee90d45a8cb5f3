package proxy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestMainServesTheConfigUntilItsContextEnds(t *testing.T) {
	w := newWorld()
	srv := w.serveHTTP(t, "svc-a", "127.0.0.2", false)
	target := srv.Listener.Addr().String()
	socket := filepath.Join(socketDir(t), "a.sock")
	config := fmt.Sprintf(`{"sandboxes": [{"name": "a", "socket": %q, "allowed": [%q]}]}`, socket, target)

	tests := []struct {
		name string
		args []string
		env  map[string]string
	}{
		{"the config comes from JAZZMINE_PROXY_CONFIG", nil, map[string]string{ConfigEnv: config}},
		{"the config comes from --config-json", []string{"--config-json", config}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			stderr := &syncBuffer{}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- Main(ctx, tt.args, func(k string) string { return tt.env[k] }, stderr) }()
			defer func() {
				cancel()
				select {
				case err := <-done:
					if err != nil {
						t.Errorf("Main: %v", err)
					}
				case <-time.After(10 * time.Second):
					t.Errorf("Main did not return 10 s after its context ended")
				}
				if _, err := os.Lstat(socket); !errors.Is(err, fs.ErrNotExist) {
					t.Errorf("the socket is still there after Main returned: %v", err)
				}
			}()

			waitListening(t, stderr, done, 1)
			p := &running{sockets: map[string]string{"a": socket}, logs: stderr}
			if status, body := p.get(t, "a", "connect", target, "/main"); status != 200 || body != "svc-a GET /main " {
				t.Fatalf("got %d %q", status, body)
			}
			if status, _ := p.get(t, "a", "connect", "svc-b:8080", "/"); status != 403 {
				t.Fatalf("got %d, want 403", status)
			}
			if len(p.logged(t, "proxy: refused", map[string]any{"sandbox": "a", "target": "svc-b:8080", "level": "WARN"})) == 0 {
				t.Errorf("no JSON log line of the refusal on stderr:\n%s", stderr.Bytes())
			}
		})
	}
}

func TestMainRefusesABadCommandLineOrConfig(t *testing.T) {
	tests := []struct {
		name    string
		args    []string
		env     string
		want    string
		wantErr error
	}{
		{"no config at all is an error naming the variable", nil, "", "set JAZZMINE_PROXY_CONFIG or --config-json", nil},
		{"an invalid config names the field", nil, `{"sandboxes": [{"name": "a", "socket": "x.sock"}]}`, "sandboxes[0].socket", ErrInvalidConfig},
		{"a sandbox without a socket is an invalid config", nil, `{"sandboxes": [{"name": "a"}]}`, `sandboxes[0].socket: sandbox "a" needs a socket`, ErrInvalidConfig},
		{"an unknown flag is an error", []string{"--nope"}, "", "flag provided but not defined", nil},
		{"an argument is an error", []string{"extra"}, "", "unexpected arguments", nil},
		{"a bad log level is an error", []string{"--log-level", "loud"}, "", "--log-level", nil},
		{"a socket that cannot be listened on is an error", nil,
			`{"sandboxes": [{"name": "a", "socket": "/nonexistent/jazzmine/a.sock"}]}`, "listen on /nonexistent/jazzmine/a.sock for sandbox \"a\"", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := Main(context.Background(), tt.args, func(k string) string {
				if k == ConfigEnv {
					return tt.env
				}
				return ""
			}, io.Discard)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("got %v, want an error containing %q", err, tt.want)
			}
			if tt.wantErr != nil && !errors.Is(err, tt.wantErr) {
				t.Fatalf("got %v, want it to wrap %v", err, tt.wantErr)
			}
		})
	}
}
