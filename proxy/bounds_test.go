package proxy

import (
	"bufio"
	"errors"
	"io"
	"io/fs"
	"net"
	"os"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestConnectionCapsAnswer503(t *testing.T) {
	w := newWorld()
	services(t, w)
	p := start(t, w, Config{Sandboxes: sandboxes(), MaxConns: 3, MaxConnsPerSandbox: 2, allowLoopback: true})

	first, _ := p.connect(t, "a", "svc-a:8080")
	p.connect(t, "a", "svc-a:8080")
	if status, body := p.get(t, "a", "connect", "svc-a:8080", "/"); status != 503 || !strings.Contains(body, `too many connections from sandbox "a" (2)`) {
		t.Fatalf("a third connection of sandbox a: got %d %q, want 503 naming the sandbox cap", status, body)
	}
	p.connect(t, "b", "svc-b:8080") // the per-sandbox cap is a's alone
	if status, body := p.get(t, "b", "connect", "svc-b:8080", "/"); status != 503 || !strings.Contains(body, "too many connections (3)") {
		t.Fatalf("a fourth connection in all: got %d %q, want 503 naming the total cap", status, body)
	}
	if len(p.logged(t, "proxy: refused a connection over the cap", map[string]any{"sandbox": "a"})) == 0 {
		t.Errorf("no log line for the refused connection")
	}

	// A closed tunnel frees its place.
	first.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		status, body := p.get(t, "b", "connect", "svc-b:8080", "/ok")
		if status == 200 && body == "svc-b GET /ok " {
			break
		}
		if status != 503 || time.Now().After(deadline) {
			t.Fatalf("after a tunnel closed: got %d %q, want 200 from svc-b", status, body)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestIdleConnectionsAreClosed(t *testing.T) {
	w := newWorld()
	w.name("svc-a", "127.0.0.2")
	w.serveHTTP(t, "svc-a", "127.0.0.2", false, "8080")
	w.name("silent", "127.0.0.5")
	w.serveTCP(t, "127.0.0.5", "7000", func(c net.Conn) { io.Copy(io.Discard, c) })
	w.name("talker", "127.0.0.5")
	w.serveTCP(t, "127.0.0.5", "7001", func(c net.Conn) { // 20 bytes over 1 s, then the end
		for i := range 20 {
			if _, err := c.Write([]byte{byte('a' + i)}); err != nil {
				return
			}
			time.Sleep(50 * time.Millisecond)
		}
	})
	w.name("listener", "127.0.0.5")
	w.serveTCP(t, "127.0.0.5", "7002", func(c net.Conn) { // reads 20 bytes, then answers
		if _, err := io.ReadFull(c, make([]byte, 20)); err == nil {
			io.WriteString(c, "got 20")
		}
	})
	sb := []Sandbox{{
		Name:    "a",
		Allowed: []string{"svc-a:8080", "silent:7000", "talker:7001", "listener:7002"},
	}}
	const idle = 300 * time.Millisecond
	p := start(t, w, Config{Sandboxes: sb, IdleTimeout: idle, HeaderTimeout: idle, allowLoopback: true})

	// closed reads from c until it ends, and fails unless the proxy ended it.
	closed := func(t *testing.T, r io.Reader) {
		t.Helper()
		if _, err := io.Copy(io.Discard, r); err != nil {
			t.Fatalf("want the proxy to close the connection, got %v", err)
		}
	}

	t.Run("a tunnel in which no byte moves is closed", func(t *testing.T) {
		_, br := p.connect(t, "a", "silent:7000")
		closed(t, br)
		p.waitLogged(t, "proxy: tunnel closed", map[string]any{"target": "silent:7000", "end": "idle"})
	})

	t.Run("a tunnel with bytes moving only to the client stays open", func(t *testing.T) {
		_, br := p.connect(t, "a", "talker:7001")
		got, err := io.ReadAll(br)
		if err != nil || string(got) != "abcdefghijklmnopqrst" {
			t.Fatalf("got %q, %v; want the 20 bytes the target sent over 1 s", got, err)
		}
	})

	t.Run("a tunnel with bytes moving only to the target stays open", func(t *testing.T) {
		c, br := p.connect(t, "a", "listener:7002")
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for range 20 {
			<-tick.C
			if _, err := c.Write([]byte{'x'}); err != nil {
				t.Fatal(err)
			}
		}
		got, err := io.ReadAll(br)
		if err != nil || string(got) != "got 20" {
			t.Fatalf("got %q, %v; want the target's answer after 20 bytes over 1 s", got, err)
		}
	})

	t.Run("a keep-alive connection that sends no next request is closed", func(t *testing.T) {
		c := p.dial(t, "a")
		br := bufio.NewReader(c)
		io.WriteString(c, "GET http://svc-a:8080/ HTTP/1.1\r\nHost: svc-a:8080\r\n\r\n")
		if resp, body := readResponse(t, br, "GET"); resp.StatusCode != 200 || resp.Close {
			t.Fatalf("got %d %q (close %v)", resp.StatusCode, body, resp.Close)
		}
		closed(t, br)
	})

	t.Run("a client that does not finish its header in time is disconnected", func(t *testing.T) {
		c := p.dial(t, "a")
		io.WriteString(c, "GET http://svc-a:8080/ HTTP/1.1\r\nHost: svc-a")
		got, err := io.ReadAll(c)
		if err != nil || len(got) != 0 {
			t.Fatalf("got %q, %v; want the connection closed without an answer", got, err)
		}
	})
}

func TestCancellingServeClosesEverythingAndLeavesNoGoroutine(t *testing.T) {
	w := newWorld()
	w.name("svc-a", "127.0.0.2")
	w.serveHTTP(t, "svc-a", "127.0.0.2", false, "8080")
	w.name("silent", "127.0.0.5")
	w.serveTCP(t, "127.0.0.5", "7000", func(c net.Conn) { io.Copy(io.Discard, c) })
	w.name("hang", "127.0.0.6")
	w.hang["127.0.0.6:7000"] = true
	sb := []Sandbox{{
		Name:    "a",
		Allowed: []string{"svc-a:8080", "silent:7000", "hang:7000"},
	}}
	ignore := goleak.IgnoreCurrent() // the test services
	p := start(t, w, Config{Sandboxes: sb, allowLoopback: true})

	_, tunnel := p.connect(t, "a", "silent:7000")
	keepAlive := p.dial(t, "a")
	ka := bufio.NewReader(keepAlive)
	io.WriteString(keepAlive, "GET http://svc-a:8080/ HTTP/1.1\r\nHost: svc-a:8080\r\n\r\n")
	readResponse(t, ka, "GET")
	halfHeader := p.dial(t, "a")
	io.WriteString(halfHeader, "GET http://svc-a:8080/ HTTP/1.1\r\n")
	dialling := p.dial(t, "a")
	io.WriteString(dialling, "CONNECT hang:7000 HTTP/1.1\r\nHost: hang:7000\r\n\r\n")
	for !slices.Contains(w.dials(), "127.0.0.6:7000") { // the dial is under way
		time.Sleep(5 * time.Millisecond)
	}

	if err := p.shutdown(); err != nil {
		t.Fatalf("Serve: %v", err)
	}
	for name, r := range map[string]io.Reader{"tunnel": tunnel, "keep-alive": ka, "half header": halfHeader, "dialling": dialling} {
		if _, err := io.Copy(io.Discard, r); err != nil && !errors.Is(err, syscall.ECONNRESET) {
			t.Errorf("%s connection: want it closed by the proxy, got %v", name, err)
		}
	}
	if _, err := os.Lstat(p.sockets["a"]); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the socket is still there: %v", err)
	}
	if c, err := net.DialTimeout("unix", p.sockets["a"], time.Second); err == nil {
		c.Close()
		t.Errorf("the listener still accepts connections")
	}
	goleak.VerifyNone(t, ignore)
}
