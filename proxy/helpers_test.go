package proxy

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// Source addresses the tests dial the proxy from: sandbox "a" owns
// 127.0.0.8/29, sandbox "b" 127.0.0.16/29, and 127.0.0.99 is in no sandbox.
const (
	srcA    = "127.0.0.9"
	srcA2   = "127.0.0.10"
	srcB    = "127.0.0.17"
	srcNone = "127.0.0.99"
)

// world is the network the proxy sees in tests: its Resolver maps names to
// addresses, and its Dial hook connects an address the proxy dials
// ("127.0.0.2:8080") to the loopback listener of the test service behind it,
// so that tests use fixed ports, never leave 127.0.0.0/8, and can tell what the
// proxy dialled.
type world struct {
	mu      sync.Mutex // guards the fields below
	names   map[string][]netip.Addr
	ports   map[string]string // address dialled -> listener answering it
	hang    map[string]bool   // addresses whose dial never completes
	dialled []string
}

func newWorld() *world {
	return &world{names: map[string][]netip.Addr{}, ports: map[string]string{}, hang: map[string]bool{}}
}

// LookupNetIP implements Resolver.
func (w *world) LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if addrs, ok := w.names[host]; ok {
		return slices.Clone(addrs), nil
	}
	return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
}

// Dial is the proxy's Dial hook.
func (w *world) Dial(ctx context.Context, network, addr string) (net.Conn, error) {
	w.mu.Lock()
	w.dialled = append(w.dialled, addr)
	real, ok := w.ports[addr]
	hang := w.hang[addr]
	w.mu.Unlock()
	if hang {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	if !ok {
		return nil, fmt.Errorf("dial %s: connection refused (no test service there)", addr)
	}
	var d net.Dialer
	return d.DialContext(ctx, network, real)
}

// name makes host resolve to addrs.
func (w *world) name(host string, addrs ...string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, a := range addrs {
		w.names[host] = append(w.names[host], netip.MustParseAddr(a))
	}
}

// route makes a dial of addr reach the listener at real.
func (w *world) route(addr, real string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.ports[addr] = real
}

// dials returns the addresses the proxy dialled so far.
func (w *world) dials() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.dialled)
}

// serveHTTP starts an HTTP service named name on ip, answering dials of
// ip:port for each port; with tls it serves HTTPS (certificate for
// "example.com"). It returns the server, closed at the end of the test.
func (w *world) serveHTTP(t *testing.T, name, ip string, tls bool, ports ...string) *httptest.Server {
	t.Helper()
	srv := httptest.NewUnstartedServer(service(name))
	srv.Listener.Close()
	ln, err := net.Listen("tcp", ip+":0")
	if err != nil {
		t.Fatal(err)
	}
	srv.Listener = ln
	if tls {
		srv.StartTLS()
	} else {
		srv.Start()
	}
	t.Cleanup(srv.Close)
	for _, p := range ports {
		w.route(net.JoinHostPort(ip, p), ln.Addr().String())
	}
	return srv
}

// service is the handler of a test HTTP service.
func service(name string) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/headers", func(w http.ResponseWriter, r *http.Request) {
		var names []string
		for k := range r.Header {
			names = append(names, k)
		}
		slices.Sort(names)
		fmt.Fprintf(w, "host=%s headers=%s", r.Host, strings.Join(names, ","))
	})
	mux.HandleFunc("/stream", func(w http.ResponseWriter, r *http.Request) {
		for _, part := range []string{"one ", "two ", "three"} {
			io.WriteString(w, part)
			w.(http.Flusher).Flush() // no Content-Length: chunked
		}
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		fmt.Fprintf(w, "%s %s %s %s", name, r.Method, r.URL.Path, body)
	})
	return mux
}

// serveTCP starts a raw TCP service on ip, answering dials of ip:port with
// handle (which need not close the connection). It stops at the end of the test.
func (w *world) serveTCP(t *testing.T, ip, port string, handle func(net.Conn)) {
	t.Helper()
	ln, err := net.Listen("tcp", ip+":0")
	if err != nil {
		t.Fatal(err)
	}
	w.route(net.JoinHostPort(ip, port), ln.Addr().String())
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Go(func() {
				defer c.Close()
				handle(c)
			})
		}
	})
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
}

// running is a proxy serving on 127.0.0.1 for one test.
type running struct {
	srv  *Server
	addr string
	logs *syncBuffer
	stop context.CancelFunc
	done chan error // Serve's result

	once   sync.Once
	result error
}

// shutdown ends Serve's context and returns what Serve returned, or an error
// if it did not return within 10 s.
func (r *running) shutdown() error {
	r.once.Do(func() {
		r.stop()
		select {
		case r.result = <-r.done:
		case <-time.After(10 * time.Second):
			r.result = errors.New("Serve did not return 10 s after its context ended")
		}
	})
	return r.result
}

// start serves cfg (with w as its Resolver and Dial hook) until the end of the
// test, and checks then that Serve returned nil.
func start(t *testing.T, w *world, cfg Config) *running {
	t.Helper()
	if w != nil {
		cfg.Resolver = w
		cfg.Dial = w.Dial
	}
	logs := &syncBuffer{}
	cfg.Logger = slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	srv, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{srv: srv, addr: ln.Addr().String(), logs: logs, stop: cancel, done: make(chan error, 1)}
	go func() { r.done <- srv.Serve(ctx, ln) }()
	t.Cleanup(func() {
		if err := r.shutdown(); err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return r
}

// dial connects to the proxy from the source address src.
func (r *running) dial(t *testing.T, src string) net.Conn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}, Timeout: 5 * time.Second}
	c, err := d.Dial("tcp", r.addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(10 * time.Second))
	return c
}

// readResponse reads one response to a request of method from br, body included.
func readResponse(t *testing.T, br *bufio.Reader, method string) (*http.Response, string) {
	t.Helper()
	resp, err := http.ReadResponse(br, &http.Request{Method: method})
	if err != nil {
		t.Fatalf("reading the response to %s: %v", method, err)
	}
	if method == http.MethodConnect && resp.StatusCode/100 == 2 {
		return resp, "" // the tunnel follows
	}
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("reading the body of the response to %s: %v", method, err)
	}
	return resp, string(body)
}

// get fetches path from target from the source src, through a CONNECT tunnel
// (mode "connect", plain HTTP inside) or as an absolute URI (mode "absolute").
// It returns the status and body of the proxy's refusal, or else the target's
// answer.
func (r *running) get(t *testing.T, src, mode, target, path string) (int, string) {
	t.Helper()
	c := r.dial(t, src)
	br := bufio.NewReader(c)
	switch mode {
	case "absolute":
		fmt.Fprintf(c, "GET http://%s%s HTTP/1.1\r\nHost: %s\r\n\r\n", target, path, target)
		resp, body := readResponse(t, br, "GET")
		return resp.StatusCode, body
	case "connect":
		fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", target, target)
		resp, body := readResponse(t, br, "CONNECT")
		if resp.StatusCode != http.StatusOK {
			return resp.StatusCode, body
		}
		fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: %s\r\n\r\n", path, target)
		resp, body = readResponse(t, br, "GET")
		return resp.StatusCode, body
	}
	t.Fatalf("unknown mode %q", mode)
	return 0, ""
}

// connect opens a tunnel to target from src and returns it, ready for bytes.
func (r *running) connect(t *testing.T, src, target string) (net.Conn, *bufio.Reader) {
	t.Helper()
	c := r.dial(t, src)
	br := bufio.NewReader(c)
	fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", target, target)
	if resp, body := readResponse(t, br, "CONNECT"); resp.StatusCode != http.StatusOK {
		t.Fatalf("CONNECT %s from %s: %s %s", target, src, resp.Status, body)
	}
	return c, br
}

// logged returns the log lines so far that have every given attribute.
func (r *running) logged(t *testing.T, msg string, attrs map[string]any) []map[string]any {
	t.Helper()
	var out []map[string]any
	for line := range bytes.Lines(r.logs.Bytes()) {
		var m map[string]any
		if err := json.Unmarshal(line, &m); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		if m["msg"] != msg {
			continue
		}
		match := true
		for k, v := range attrs {
			if fmt.Sprint(m[k]) != fmt.Sprint(v) {
				match = false
			}
		}
		if match {
			out = append(out, m)
		}
	}
	return out
}

// waitLogged polls until a log line with msg and attrs appears, and returns it.
func (r *running) waitLogged(t *testing.T, msg string, attrs map[string]any) map[string]any {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if lines := r.logged(t, msg, attrs); len(lines) > 0 {
			return lines[0]
		}
		if time.Now().After(deadline) {
			t.Fatalf("no log line %q with %v in:\n%s", msg, attrs, r.logs.Bytes())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// syncBuffer is a bytes.Buffer safe for concurrent use.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) Bytes() []byte {
	b.mu.Lock()
	defer b.mu.Unlock()
	return bytes.Clone(b.buf.Bytes())
}

// sandboxes is the usual pair: "a" allowed svc-a on 8080 and 8443 and the
// other names its tests need, "b" allowed only svc-b:8080.
func sandboxes() []Sandbox {
	return []Sandbox{
		{
			Name:    "a",
			Subnets: []netip.Prefix{netip.MustParsePrefix("127.0.0.8/29")},
			Allowed: []string{"svc-a:8080", "svc-a:8443", "*.api.test:80", "sneaky:8080", "ghost:8080", "svc-a:7070"},
		},
		{
			Name:    "b",
			Subnets: []netip.Prefix{netip.MustParsePrefix("127.0.0.16/29")},
			Allowed: []string{"svc-b:8080"},
		},
	}
}

// services starts svc-a (127.0.0.2: HTTP on 8080 and 9090, HTTPS on 8443),
// svc-b (127.0.0.3: HTTP on 8080) and eu.api.test (127.0.0.4: HTTP on 80), and
// names sneaky, which resolves into sandbox b's network. It returns svc-a's
// HTTPS server.
func services(t *testing.T, w *world) *httptest.Server {
	t.Helper()
	w.name("svc-a", "127.0.0.2")
	w.name("svc-b", "127.0.0.3")
	w.name("eu.api.test", "127.0.0.4")
	w.name("api.test", "127.0.0.4")
	w.name("sneaky", "127.0.0.18")
	w.serveHTTP(t, "svc-a", "127.0.0.2", false, "8080", "9090")
	tlsSrv := w.serveHTTP(t, "svc-a", "127.0.0.2", true, "8443")
	w.serveHTTP(t, "svc-b", "127.0.0.3", false, "8080")
	w.serveHTTP(t, "api", "127.0.0.4", false, "80")
	w.serveHTTP(t, "sneaky", "127.0.0.18", false, "8080")
	return tlsSrv
}
