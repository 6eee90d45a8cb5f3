package proxy

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// world is the network the proxy sees in tests: its Resolver maps names to
// addresses (fully qualified names only: a name asked for without its
// trailing dot is not found, as a search domain might find it), and its Dial hook connects an address the proxy dials
// ("127.0.0.2:8080") to the loopback listener of the test service behind it,
// so that tests use fixed ports, never leave 127.0.0.0/8, and can tell what the
// proxy dialled.
type world struct {
	mu      sync.Mutex // guards the fields below
	names   map[string][]netip.Addr
	ports   map[string]string // address dialled -> listener answering it
	hang    map[string]bool   // addresses whose dial never completes
	dialled []string
	asked   []string // names looked up
}

func newWorld() *world {
	return &world{names: map[string][]netip.Addr{}, ports: map[string]string{}, hang: map[string]bool{}}
}

// LookupNetIP implements Resolver.
func (w *world) LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.asked = append(w.asked, host)
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

// name makes host (without its trailing dot) resolve to addrs when it is
// asked for fully qualified.
func (w *world) name(host string, addrs ...string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, a := range addrs {
		w.names[host+"."] = append(w.names[host+"."], netip.MustParseAddr(a))
	}
}

// lookups returns the names looked up so far.
func (w *world) lookups() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.asked)
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

// trickle is a raw TCP service's handler that sends "abcdefghijklmnopqrst", a
// byte every every, then ends.
func trickle(every time.Duration) func(net.Conn) {
	return func(c net.Conn) {
		for i := range 20 {
			if _, err := c.Write([]byte{byte('a' + i)}); err != nil {
				return
			}
			time.Sleep(every)
		}
	}
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

// running is a proxy serving a Unix socket per sandbox for one test.
type running struct {
	srv     *Server
	sockets map[string]string // by sandbox
	logs    *syncBuffer
	stop    context.CancelFunc
	done    chan error // ListenAndServe's result

	once   sync.Once
	result error
}

// shutdown ends ListenAndServe's context and returns what it returned, or an
// error if it did not return within 10 s.
func (r *running) shutdown() error {
	r.once.Do(func() {
		r.stop()
		select {
		case r.result = <-r.done:
		case <-time.After(10 * time.Second):
			r.result = errors.New("ListenAndServe did not return 10 s after its context ended")
		}
	})
	return r.result
}

// socketDir is a new directory for sockets, removed at the end of the test. It
// is short: a socket's path may not exceed 107 bytes, and t.TempDir's name
// grows with the test's.
func socketDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "jzproxy-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// start serves cfg (with w as its Resolver and Dial hook) until the end of the
// test, on a socket per sandbox in a directory of the test unless cfg names
// one, and checks then that ListenAndServe returned nil. It returns once every
// socket is being served.
func start(t *testing.T, w *world, cfg Config) *running {
	t.Helper()
	if w != nil {
		cfg.Resolver = w
		cfg.Dial = w.Dial
	}
	logs := &syncBuffer{}
	cfg.Logger = slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	dir := socketDir(t)
	cfg.Sandboxes = slices.Clone(cfg.Sandboxes)
	sockets := map[string]string{}
	for i, sb := range cfg.Sandboxes {
		if sb.Socket == "" {
			cfg.Sandboxes[i].Socket = filepath.Join(dir, sb.Name+".sock")
		}
		sockets[sb.Name] = cfg.Sandboxes[i].Socket
	}
	srv, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{srv: srv, sockets: sockets, logs: logs, stop: cancel, done: make(chan error, 1)}
	go func() { r.done <- srv.ListenAndServe(ctx) }()
	t.Cleanup(func() {
		if err := r.shutdown(); err != nil {
			t.Errorf("ListenAndServe: %v", err)
		}
	})
	waitListening(t, logs, r.done, len(sockets))
	return r
}

// waitListening waits for n "listening" lines in the proxy's log, and fails if
// the proxy returns (its error is put back in done).
func waitListening(t *testing.T, logs *syncBuffer, done chan error, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		seen := 0
		for line := range bytes.Lines(logs.Bytes()) {
			var m struct{ Msg string }
			if json.Unmarshal(line, &m) == nil && m.Msg == "proxy: listening" {
				seen++
			}
		}
		if seen >= n {
			return
		}
		select {
		case err := <-done:
			done <- err
			t.Fatalf("the proxy returned %v before listening; log:\n%s", err, logs.Bytes())
		case <-time.After(10 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d sockets listening after 10 s; log:\n%s", seen, n, logs.Bytes())
		}
	}
}

// dial connects to the proxy on the socket of sandbox sb.
func (r *running) dial(t *testing.T, sb string) net.Conn {
	t.Helper()
	path, ok := r.sockets[sb]
	if !ok {
		t.Fatalf("no socket for sandbox %q", sb)
	}
	d := net.Dialer{Timeout: 5 * time.Second}
	c, err := d.Dial("unix", path)
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

// get fetches path from target as sandbox sb, through a CONNECT tunnel
// (mode "connect", plain HTTP inside) or as an absolute URI (mode "absolute").
// It returns the status and body of the proxy's refusal, or else the target's
// answer.
func (r *running) get(t *testing.T, sb, mode, target, path string) (int, string) {
	t.Helper()
	c := r.dial(t, sb)
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

// connect opens a tunnel to target as sandbox sb and returns it, ready for bytes.
func (r *running) connect(t *testing.T, sb, target string) (net.Conn, *bufio.Reader) {
	t.Helper()
	c := r.dial(t, sb)
	br := bufio.NewReader(c)
	fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", target, target)
	if resp, body := readResponse(t, br, "CONNECT"); resp.StatusCode != http.StatusOK {
		t.Fatalf("CONNECT %s as sandbox %s: %s %s", target, sb, resp.Status, body)
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
	var lines []map[string]any
	if !eventually(func() bool { lines = r.logged(t, msg, attrs); return len(lines) > 0 }) {
		t.Fatalf("no log line %q with %v in:\n%s", msg, attrs, r.logs.Bytes())
	}
	return lines[0]
}

// eventually polls done until it holds, for up to 10 s; it reports whether it
// held.
func eventually(done func() bool) bool {
	deadline := time.Now().Add(10 * time.Second)
	for !done() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(5 * time.Millisecond)
	}
	return true
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
		{Name: "a", Allowed: []string{"svc-a:8080", "svc-a:8443", "*.api.test:80", "ghost:8080", "svc-a:7070"}},
		{Name: "b", Allowed: []string{"svc-b:8080"}},
	}
}

// services starts svc-a (127.0.0.2: HTTP on 8080 and 9090, HTTPS on 8443),
// svc-b (127.0.0.3: HTTP on 8080) and eu.api.test (127.0.0.4: HTTP on 80). It
// returns svc-a's HTTPS server.
func services(t *testing.T, w *world) *httptest.Server {
	t.Helper()
	w.name("svc-a", "127.0.0.2")
	w.name("svc-b", "127.0.0.3")
	w.name("eu.api.test", "127.0.0.4")
	w.name("api.test", "127.0.0.4")
	w.serveHTTP(t, "svc-a", "127.0.0.2", false, "8080", "9090")
	tlsSrv := w.serveHTTP(t, "svc-a", "127.0.0.2", true, "8443")
	w.serveHTTP(t, "svc-b", "127.0.0.3", false, "8080")
	w.serveHTTP(t, "api", "127.0.0.4", false, "80")
	return tlsSrv
}

// dnsServer is a DNS server on 127.0.0.1 (UDP) for Go's own resolver in
// tests: it answers A and AAAA questions for the names it knows, "no such
// name" for the others, and records every question's name.
type dnsServer struct {
	addr  string
	names map[string]netip.Addr // fully qualified, lower case

	mu    sync.Mutex // guards asked
	asked []string
}

// serveDNS serves names (fully qualified name -> address) until the end of the test.
func serveDNS(t *testing.T, names map[string]string) *dnsServer {
	t.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	d := &dnsServer{addr: pc.LocalAddr().String(), names: map[string]netip.Addr{}}
	for name, a := range names {
		d.names[name] = netip.MustParseAddr(a)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 1500)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			if resp := d.answer(buf[:n]); resp != nil {
				pc.WriteTo(resp, from)
			}
		}
	}()
	t.Cleanup(func() {
		pc.Close()
		<-done
	})
	return d
}

// resolver is Go's resolver, sending every query to d.
func (d *dnsServer) resolver() *net.Resolver {
	return &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var dialer net.Dialer
		return dialer.DialContext(ctx, "udp", d.addr)
	}}
}

// questions returns the names asked for so far.
func (d *dnsServer) questions() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Clone(d.asked)
}

// answer returns the response to the query q (RFC 1035 section 4), or nil
// for a query it does not understand.
func (d *dnsServer) answer(q []byte) []byte {
	if len(q) < 12 || binary.BigEndian.Uint16(q[4:]) != 1 {
		return nil
	}
	var labels []string
	i := 12
	for {
		if i >= len(q) {
			return nil
		}
		l := int(q[i])
		i++
		if l == 0 {
			break
		}
		if l > 63 || i+l > len(q) {
			return nil
		}
		labels = append(labels, string(q[i:i+l]))
		i += l
	}
	if i+4 > len(q) {
		return nil
	}
	qtype := binary.BigEndian.Uint16(q[i:])
	name := strings.ToLower(strings.Join(labels, ".")) + "."
	d.mu.Lock()
	d.asked = append(d.asked, name)
	d.mu.Unlock()

	a, known := d.names[name]
	var rdata []byte
	switch {
	case known && qtype == 1 && a.Is4(), known && qtype == 28 && a.Is6():
		rdata = a.AsSlice()
	}
	flags := uint16(0x8580) // a response, authoritative, recursion desired and available
	if !known {
		flags |= 3 // no such name
	}
	resp := binary.BigEndian.AppendUint16(nil, binary.BigEndian.Uint16(q))
	resp = binary.BigEndian.AppendUint16(resp, flags)
	resp = binary.BigEndian.AppendUint16(resp, 1) // the question
	if rdata != nil {
		resp = binary.BigEndian.AppendUint16(resp, 1) // one answer
	} else {
		resp = binary.BigEndian.AppendUint16(resp, 0)
	}
	resp = append(resp, 0, 0, 0, 0) // no authority, no additional records
	resp = append(resp, q[12:i+4]...)
	if rdata != nil {
		resp = append(resp, 0xc0, 12) // the question's name
		resp = binary.BigEndian.AppendUint16(resp, qtype)
		resp = binary.BigEndian.AppendUint16(resp, 1)  // class IN
		resp = binary.BigEndian.AppendUint32(resp, 60) // TTL
		resp = binary.BigEndian.AppendUint16(resp, uint16(len(rdata)))
		resp = append(resp, rdata...)
	}
	return resp
}
