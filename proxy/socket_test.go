package proxy

import (
	"context"
	"errors"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestEachSandboxGetsASocketOfItsOwn(t *testing.T) {
	w := newWorld()
	services(t, w)

	t.Run("each socket is connectable by every user, and removed when the proxy stops", func(t *testing.T) {
		p := start(t, w, Config{Sandboxes: sandboxes(), allowLoopback: true})
		for name, path := range p.sockets {
			fi, err := os.Lstat(path)
			if err != nil {
				t.Fatal(err)
			}
			if fi.Mode().Type() != fs.ModeSocket || fi.Mode().Perm() != 0o666 {
				t.Errorf("the socket of sandbox %s is %v, want a socket with mode 0666 (the sandbox's uid is not the proxy's)", name, fi.Mode())
			}
		}
		if err := p.shutdown(); err != nil {
			t.Fatal(err)
		}
		for name, path := range p.sockets {
			if _, err := os.Lstat(path); !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("the socket of sandbox %s is still there: %v", name, err)
			}
		}
	})

	t.Run("a socket left by a proxy that died is replaced", func(t *testing.T) {
		path := filepath.Join(socketDir(t), "a.sock")
		stale, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
		if err != nil {
			t.Fatal(err)
		}
		stale.SetUnlinkOnClose(false)
		stale.Close()
		sb := sandboxes()
		sb[0].Socket = path
		p := start(t, w, Config{Sandboxes: sb, allowLoopback: true})
		if status, body := p.get(t, "a", "connect", "svc-a:8080", "/again"); status != 200 || body != "svc-a GET /again " {
			t.Fatalf("got %d %q", status, body)
		}
	})

	t.Run("a socket another process listens on is not taken over", func(t *testing.T) {
		path := filepath.Join(socketDir(t), "a.sock")
		other, err := net.Listen("unix", path)
		if err != nil {
			t.Fatal(err)
		}
		defer other.Close()
		err = listenAndServeOnce(t, Config{Sandboxes: []Sandbox{{Name: "a", Socket: path}}})
		if err == nil || !strings.Contains(err.Error(), "is in use by another process") {
			t.Fatalf("got %v, want a refusal naming the socket in use", err)
		}
		accepted := make(chan error, 1)
		go func() {
			c, err := other.Accept()
			if err == nil {
				c.Close()
			}
			accepted <- err
		}()
		c, err := net.DialTimeout("unix", path, 5*time.Second)
		if err != nil {
			t.Fatalf("the other process's socket is gone: %v", err)
		}
		c.Close()
		if err := <-accepted; err != nil {
			t.Fatal(err)
		}
	})

	t.Run("a file that is not a socket is left alone", func(t *testing.T) {
		path := filepath.Join(socketDir(t), "a.sock")
		if err := os.WriteFile(path, []byte("keep me"), 0o600); err != nil {
			t.Fatal(err)
		}
		err := listenAndServeOnce(t, Config{Sandboxes: []Sandbox{{Name: "a", Socket: path}}})
		if err == nil || !strings.Contains(err.Error(), "exists and is not a socket") {
			t.Fatalf("got %v, want a refusal naming the file", err)
		}
		if data, err := os.ReadFile(path); err != nil || string(data) != "keep me" {
			t.Fatalf("the file is now %q, %v", data, err)
		}
	})

	t.Run("a sandbox without a socket cannot be listened for", func(t *testing.T) {
		err := listenAndServeOnce(t, Config{Sandboxes: []Sandbox{{Name: "a"}}})
		if err == nil || !strings.Contains(err.Error(), `sandbox "a" has no socket`) {
			t.Fatalf("got %v", err)
		}
	})

	t.Run("Serve refuses a sandbox that is not in the config, and closes the listener", func(t *testing.T) {
		srv, err := New(Config{Sandboxes: []Sandbox{{Name: "a"}}, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
		if err != nil {
			t.Fatal(err)
		}
		ln, err := net.Listen("unix", filepath.Join(socketDir(t), "x.sock"))
		if err != nil {
			t.Fatal(err)
		}
		if err := srv.Serve(context.Background(), "b", ln); err == nil || !strings.Contains(err.Error(), `sandbox "b" is not in the config`) {
			t.Fatalf("got %v", err)
		}
		if _, err := ln.Accept(); !errors.Is(err, net.ErrClosed) {
			t.Fatalf("the listener is still open: %v", err)
		}
	})
}

// listenAndServeOnce runs ListenAndServe on cfg and returns its error, which
// must come before it serves anything.
func listenAndServeOnce(t *testing.T, cfg Config) error {
	t.Helper()
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	srv, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- srv.ListenAndServe(ctx) }()
	select {
	case err := <-done:
		return err
	case <-time.After(10 * time.Second):
		cancel()
		<-done
		t.Fatal("ListenAndServe served instead of failing")
		return nil
	}
}
