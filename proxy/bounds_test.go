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

func TestEachSandboxHoldsAtMostItsShareOfTheConnections(t *testing.T) {
	w := newWorld()
	services(t, w)
	// Four connections for two sandboxes: two each, though MaxConnsPerSandbox
	// would let one sandbox take all four.
	p := start(t, w, Config{Sandboxes: sandboxes(), MaxConns: 4, MaxConnsPerSandbox: 4, allowLoopback: true})

	first, _ := p.connect(t, "a", "svc-a:8080")
	p.connect(t, "a", "svc-a:8080")
	if status, body := p.get(t, "a", "connect", "svc-a:8080", "/"); status != 503 || !strings.Contains(body, `too many connections from sandbox "a" (2)`) {
		t.Fatalf("a third connection of sandbox a: got %d %q, want 503 naming its share", status, body)
	}
	if len(p.logged(t, "proxy: refused a connection over the cap", map[string]any{"sandbox": "a"})) == 0 {
		t.Errorf("no log line for the refused connection")
	}
	// Sandbox a holding its whole share leaves sandbox b its own.
	p.connect(t, "b", "svc-b:8080")
	if status, body := p.get(t, "b", "connect", "svc-b:8080", "/b"); status != 200 || body != "svc-b GET /b " {
		t.Fatalf("sandbox b while a holds its share: got %d %q, want 200 from svc-b", status, body)
	}
	if status, body := p.get(t, "b", "connect", "svc-b:8080", "/"); status != 503 || !strings.Contains(body, `too many connections from sandbox "b" (2)`) {
		t.Fatalf("a third connection of sandbox b: got %d %q, want 503 naming its share", status, body)
	}

	// A closed tunnel frees its place.
	first.Close()
	waitServed(t, p, "a", "svc-a:8080")
}

func TestTheShareOfEachSandboxIsTheSmallerCap(t *testing.T) {
	five := []Sandbox{{Name: "a"}, {Name: "b"}, {Name: "c"}, {Name: "d"}, {Name: "e"}}
	tests := []struct {
		name       string
		maxConns   int
		perSandbox int
		want       int
	}{
		{"the defaults give five sandboxes 51 each", 0, 0, 51},
		{"max_conns_per_sandbox caps a share that is larger", 256, 10, 10},
		{"max_conns is shared out, rounding down", 14, 64, 2},
		{"one connection each when there are as many as sandboxes", 5, 0, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv, err := New(Config{Sandboxes: five, MaxConns: tt.maxConns, MaxConnsPerSandbox: tt.perSandbox})
			if err != nil {
				t.Fatal(err)
			}
			if srv.perSandbox != tt.want {
				t.Fatalf("each sandbox may hold %d connections, want %d", srv.perSandbox, tt.want)
			}
		})
	}
	if _, err := New(Config{Sandboxes: five, MaxConns: 4}); !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), "max_conns: 4 is fewer than the sandboxes (5)") {
		t.Fatalf("four connections for five sandboxes: got %v, want a config error", err)
	}
}

// waitServed polls until sandbox sb is served a tunnel to target (a
// connection over its cap is answered 503 until then), and fails after 10 s.
func waitServed(t *testing.T, p *running, sb, target string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		status, body := p.get(t, sb, "connect", target, "/ok")
		if status == 200 {
			return
		}
		if status != 503 || time.Now().After(deadline) {
			t.Fatalf("sandbox %s asking for %s: got %d %q, want 200 once a connection is free", sb, target, status, body)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestAClientThatEndsItsSideFreesItsConnectionWithinTheGrace(t *testing.T) {
	w := newWorld()
	w.name("svc-a", "127.0.0.2")
	w.serveHTTP(t, "svc-a", "127.0.0.2", false, "8080")
	// A target that reads what it is sent, and then neither answers nor closes.
	hush := make(chan struct{})
	w.name("silent", "127.0.0.5")
	w.serveTCP(t, "127.0.0.5", "7000", func(c net.Conn) {
		io.Copy(io.Discard, c)
		<-hush
	})
	t.Cleanup(func() { close(hush) }) // before serveTCP's cleanup waits for the handlers
	w.name("talker", "127.0.0.5")
	w.serveTCP(t, "127.0.0.5", "7001", trickle(25*time.Millisecond)) // 20 bytes over 0.5 s, then the end
	sb := []Sandbox{{Name: "a", Allowed: []string{"svc-a:8080", "silent:7000", "talker:7001"}}}
	// One connection, an idle timeout no test waits for, and a short grace.
	p := start(t, w, Config{Sandboxes: sb, MaxConnsPerSandbox: 1, IdleTimeout: time.Hour, CloseGrace: 250 * time.Millisecond, allowLoopback: true})

	t.Run("a tunnel whose client closed is closed although its target stays silent", func(t *testing.T) {
		waitFree(t, p, "a")
		c, _ := p.connect(t, "a", "silent:7000")
		io.WriteString(c, "hello")
		c.Close()
		waitServed(t, p, "a", "svc-a:8080")
		p.waitLogged(t, "proxy: tunnel closed", map[string]any{"target": "silent:7000", "end": "client ended"})
	})

	t.Run("a forwarded request whose client closed is dropped although its target never answers", func(t *testing.T) {
		waitFree(t, p, "a")
		c := p.dial(t, "a")
		before := len(w.dials())
		io.WriteString(c, "GET http://silent:7000/ HTTP/1.1\r\nHost: silent:7000\r\n\r\n")
		waitDialled(t, w, before)
		c.Close()
		waitServed(t, p, "a", "svc-a:8080")
		p.waitLogged(t, "proxy: forwarded", map[string]any{"target": "silent:7000", "end": "client ended"})
	})

	t.Run("a client that pipelines bytes and then closes is dropped too", func(t *testing.T) {
		waitFree(t, p, "a")
		c := p.dial(t, "a")
		before := len(w.dials())
		io.WriteString(c, "GET http://silent:7000/1 HTTP/1.1\r\nHost: silent:7000\r\n\r\n")
		waitDialled(t, w, before)
		io.WriteString(c, "GET http://silent:7000/2 HTTP/1.1\r\n")
		c.Close()
		waitServed(t, p, "a", "svc-a:8080")
	})

	t.Run("a client that ended its side still gets what its target sends", func(t *testing.T) {
		waitFree(t, p, "a")
		c, br := p.connect(t, "a", "talker:7001")
		if err := c.(*net.UnixConn).CloseWrite(); err != nil {
			t.Fatal(err)
		}
		got, err := io.ReadAll(br)
		if err != nil || string(got) != "abcdefghijklmnopqrst" {
			t.Fatalf("got %q, %v; want the 20 bytes the target sent, the grace counting from the last", got, err)
		}
	})
}

// waitFree waits until sandbox sb holds no connection (the last subtest's
// are closed when it ends, and freed a moment later).
func waitFree(t *testing.T, p *running, sb string) {
	t.Helper()
	active := 0
	if !eventually(func() bool {
		p.srv.mu.Lock()
		defer p.srv.mu.Unlock()
		for _, x := range p.srv.sandboxes {
			if x.name == sb {
				active = x.active
			}
		}
		return active == 0
	}) {
		t.Fatalf("sandbox %s still holds %d connections after 10 s", sb, active)
	}
}

// waitDialled waits until the proxy dialled more than before targets.
func waitDialled(t *testing.T, w *world, before int) {
	t.Helper()
	if !eventually(func() bool { return len(w.dials()) > before }) {
		t.Fatal("the proxy did not dial the target within 10 s")
	}
}

func TestIdleConnectionsAreClosed(t *testing.T) {
	w := newWorld()
	w.name("svc-a", "127.0.0.2")
	w.serveHTTP(t, "svc-a", "127.0.0.2", false, "8080")
	w.name("silent", "127.0.0.5")
	w.serveTCP(t, "127.0.0.5", "7000", func(c net.Conn) { io.Copy(io.Discard, c) })
	w.name("talker", "127.0.0.5")
	w.serveTCP(t, "127.0.0.5", "7001", trickle(50*time.Millisecond)) // 20 bytes over 1 s, then the end
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
