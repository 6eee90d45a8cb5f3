package proxy

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
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
	config := fmt.Sprintf(`{"listen": "127.0.0.1:0", "sandboxes": [{"name": "a", "subnets": ["127.0.0.8/29"], "allowed": [%q]}]}`, target)

	tests := []struct {
		name string
		args []string
		env  map[string]string
	}{
		{"the config comes from JAZZMINE_PROXY_CONFIG", nil, map[string]string{ConfigEnv: config}},
		{"the config comes from --config-json", []string{"--config-json", config}, nil},
		{"--listen overrides the config's address", []string{"--listen", "127.0.0.1:0"},
			map[string]string{ConfigEnv: strings.Replace(config, "127.0.0.1:0", "127.0.0.1:1", 1)}},
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
			}()

			p := &running{addr: waitListening(t, stderr, done), logs: stderr}
			if status, body := p.get(t, srcA, "connect", target, "/main"); status != 200 || body != "svc-a GET /main " {
				t.Fatalf("got %d %q", status, body)
			}
			if status, _ := p.get(t, srcA, "connect", "svc-b:8080", "/"); status != 403 {
				t.Fatalf("got %d, want 403", status)
			}
			if len(p.logged(t, "proxy: refused", map[string]any{"sandbox": "a", "target": "svc-b:8080", "level": "WARN"})) == 0 {
				t.Errorf("no JSON log line of the refusal on stderr:\n%s", stderr.Bytes())
			}
		})
	}
}

// waitListening returns the address in Main's "listening" log line.
func waitListening(t *testing.T, stderr *syncBuffer, done chan error) string {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		sc := bufio.NewScanner(bytes.NewReader(stderr.Bytes()))
		for sc.Scan() {
			var line struct{ Msg, Addr string }
			if json.Unmarshal(sc.Bytes(), &line) == nil && line.Msg == "proxy: listening" {
				if _, _, err := net.SplitHostPort(line.Addr); err == nil {
					return line.Addr
				}
			}
		}
		select {
		case err := <-done:
			done <- err
			t.Fatalf("Main returned %v before listening; stderr:\n%s", err, stderr.Bytes())
		case <-time.After(10 * time.Millisecond):
		}
	}
	t.Fatalf("no listening line on stderr:\n%s", stderr.Bytes())
	return ""
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
		{"an invalid config names the field", nil, `{"sandboxes": [{"name": "a", "subnets": ["x"]}]}`, "sandboxes[0].subnets[0]", ErrInvalidConfig},
		{"an unknown flag is an error", []string{"--nope"}, "", "flag provided but not defined", nil},
		{"an argument is an error", []string{"extra"}, "", "unexpected arguments", nil},
		{"a bad log level is an error", []string{"--log-level", "loud"}, "", "--log-level", nil},
		{"an address that cannot be listened on is an error", []string{"--listen", "127.0.0.1:99999"},
			`{"sandboxes": [{"name": "a", "subnets": ["10.0.0.0/8"]}]}`, "listen on 127.0.0.1:99999", nil},
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
