package proxy

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestEachSandboxReachesOnlyItsOwnAllowlist(t *testing.T) {
	w := newWorld()
	services(t, w)
	p := start(t, w, Config{Sandboxes: sandboxes(), allowLoopback: true})

	tests := []struct {
		name       string
		sandbox    string
		mode       string
		target     string
		wantStatus int
		wantBody   string
	}{
		{"sandbox a fetches svc-a:8080 with an absolute URI", "a", "absolute", "svc-a:8080", 200, "svc-a GET /hello"},
		{"sandbox a fetches svc-a:8080 through a CONNECT tunnel", "a", "connect", "svc-a:8080", 200, "svc-a GET /hello"},
		{"names match case-insensitively and without their trailing dot", "a", "connect", "SVC-A.:8080", 200, "svc-a GET /hello"},
		{"a wildcard entry matches a name below its domain, on port 80 by default", "a", "absolute", "eu.api.test", 200, "api GET /hello"},
		{"sandbox b fetches svc-b:8080", "b", "connect", "svc-b:8080", 200, "svc-b GET /hello"},

		{"sandbox a is refused svc-b:8080 in a tunnel", "a", "connect", "svc-b:8080", 403, "svc-b:8080 is not allowed for sandbox a"},
		{"sandbox a is refused svc-b:8080 with an absolute URI", "a", "absolute", "svc-b:8080", 403, "svc-b:8080 is not allowed for sandbox a"},
		{"sandbox a is refused svc-a on another port in a tunnel", "a", "connect", "svc-a:9090", 403, "svc-a:9090 is not allowed for sandbox a"},
		{"sandbox a is refused svc-a on another port with an absolute URI", "a", "absolute", "svc-a:9090", 403, "svc-a:9090 is not allowed for sandbox a"},
		{"sandbox a is refused svc-a's address, which its allowlist does not name", "a", "connect", "127.0.0.2:8080", 403, "127.0.0.2:8080 is not allowed for sandbox a"},
		{"a wildcard entry does not match its domain itself", "a", "absolute", "api.test", 403, "api.test:80 is not allowed for sandbox a"},
		{"a wildcard entry does not match another port", "a", "connect", "eu.api.test:8080", 403, "eu.api.test:8080 is not allowed for sandbox a"},
		{"sandbox b cannot reach svc-a, which only a may reach (no union)", "b", "connect", "svc-a:8080", 403, "svc-a:8080 is not allowed for sandbox b"},
		{"sandbox b cannot reach svc-a with an absolute URI either", "b", "absolute", "svc-a:8080", 403, "svc-a:8080 is not allowed for sandbox b"},
		{"an allowed name that does not resolve is a bad gateway", "a", "connect", "ghost:8080", 502, "cannot resolve ghost"},
		{"an allowed target that refuses connections is a bad gateway", "a", "connect", "svc-a:7070", 502, "cannot connect to svc-a:7070"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := len(w.dials())
			status, body := p.get(t, tt.sandbox, tt.mode, tt.target, "/hello")
			if status != tt.wantStatus || !strings.Contains(body, tt.wantBody) {
				t.Fatalf("%s %s as sandbox %s: got %d %q, want %d containing %q", tt.mode, tt.target, tt.sandbox, status, body, tt.wantStatus, tt.wantBody)
			}
			if tt.wantStatus == http.StatusForbidden {
				if dialled := w.dials()[before:]; len(dialled) > 0 {
					t.Errorf("a refused request made the proxy dial %v", dialled)
				}
				attrs := map[string]any{"sandbox": tt.sandbox, "target": canonical(tt.target), "status": 403}
				if lines := p.logged(t, "proxy: refused", attrs); len(lines) == 0 || lines[0]["level"] != "WARN" {
					t.Errorf("want a WARN log line with sandbox %s and target %s, got %v", tt.sandbox, tt.target, lines)
				}
			}
		})
	}
}

// canonical is the target as the proxy logs it.
func canonical(target string) string {
	if !strings.Contains(target, ":") {
		target += ":80"
	}
	return strings.ToLower(strings.Replace(target, ".:", ":", 1))
}

func TestAnHTTPClientUsesTheProxyForHTTPSAndHTTP(t *testing.T) {
	w := newWorld()
	tlsSrv := services(t, w)
	p := start(t, w, Config{Sandboxes: sandboxes(), allowLoopback: true})

	tr := tlsSrv.Client().Transport.(*http.Transport).Clone()
	// The client's proxy is a TCP address, as the harness's relay gives it;
	// every connection it makes reaches sandbox a's socket.
	tr.Proxy = http.ProxyURL(&url.URL{Scheme: "http", Host: "127.0.0.1:3128"})
	tr.DialContext = func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", p.sockets["a"])
	}
	tr.TLSClientConfig = tr.TLSClientConfig.Clone()
	tr.TLSClientConfig.ServerName = "example.com" // the test certificate's name
	t.Cleanup(tr.CloseIdleConnections)
	client := &http.Client{Transport: tr, Timeout: 10 * time.Second}

	tests := []struct {
		name     string
		method   string
		url      string
		body     string
		wantCode int
		wantBody string
	}{
		{"an HTTPS request goes through a CONNECT tunnel", "GET", "https://svc-a:8443/tls", "", 200, "svc-a GET /tls "},
		{"a second HTTPS request reuses the tunnel", "GET", "https://svc-a:8443/again", "", 200, "svc-a GET /again "},
		{"a plain HTTP request is forwarded", "GET", "http://svc-a:8080/plain", "", 200, "svc-a GET /plain "},
		{"a plain HTTP request with a body is forwarded", "POST", "http://svc-a:8080/post", "payload", 200, "svc-a POST /post payload"},
		{"a streamed response arrives whole", "GET", "http://svc-a:8080/stream", "", 200, "one two three"},
		{"an HTTPS request to a target not allowed fails", "GET", "https://svc-b:8080/", "", 0, ""},
		{"a plain HTTP request to a target not allowed is answered 403", "GET", "http://svc-b:8080/", "", 403, "svc-b:8080 is not allowed for sandbox a"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req, err := http.NewRequest(tt.method, tt.url, strings.NewReader(tt.body))
			if err != nil {
				t.Fatal(err)
			}
			resp, err := client.Do(req)
			if tt.wantCode == 0 {
				if err == nil || !strings.Contains(err.Error(), "Forbidden") {
					t.Fatalf("want a Forbidden error, got %v", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			body, err := io.ReadAll(resp.Body)
			if err != nil {
				t.Fatal(err)
			}
			if resp.StatusCode != tt.wantCode || !strings.Contains(string(body), tt.wantBody) {
				t.Fatalf("got %d %q, want %d containing %q", resp.StatusCode, body, tt.wantCode, tt.wantBody)
			}
		})
	}
}

func TestForwardedRequestsAreCleanedAndFramed(t *testing.T) {
	w := newWorld()
	services(t, w)
	p := start(t, w, Config{Sandboxes: sandboxes(), allowLoopback: true})

	t.Run("hop-by-hop and Proxy-* headers are not forwarded, and Host is the URI's", func(t *testing.T) {
		c := p.dial(t, "a")
		io.WriteString(c, "GET http://svc-a:8080/headers HTTP/1.1\r\nHost: elsewhere:1\r\n"+
			"Proxy-Authorization: Basic c2VjcmV0\r\nProxy-Connection: keep-alive\r\nConnection: X-Hop, keep-alive\r\n"+
			"X-Hop: 1\r\nKeep-Alive: timeout=5\r\nTe: trailers\r\nUpgrade: websocket\r\nX-Keep: 1\r\n\r\n")
		resp, body := readResponse(t, bufio.NewReader(c), "GET")
		// Connection is the proxy's own "close": one request per upstream connection.
		if want := "host=svc-a:8080 headers=Connection,X-Keep"; resp.StatusCode != 200 || body != want {
			t.Fatalf("got %d %q, want 200 %q", resp.StatusCode, body, want)
		}
	})

	t.Run("a keep-alive connection carries several requests, to different targets", func(t *testing.T) {
		c := p.dial(t, "a")
		br := bufio.NewReader(c)
		for i, target := range []string{"svc-a:8080", "eu.api.test", "svc-a:8080"} {
			fmt.Fprintf(c, "POST http://%s/n%d HTTP/1.1\r\nHost: %s\r\nContent-Length: 4\r\n\r\nbody", target, i, target)
			resp, body := readResponse(t, br, "POST")
			want := fmt.Sprintf("POST /n%d body", i)
			if resp.StatusCode != 200 || !strings.Contains(body, want) || resp.Close {
				t.Fatalf("request %d: got %d %q (close %v), want 200 containing %q, connection kept", i, resp.StatusCode, body, resp.Close, want)
			}
		}
	})

	t.Run("a chunked request body is forwarded", func(t *testing.T) {
		c := p.dial(t, "a")
		io.WriteString(c, "PUT http://svc-a:8080/chunked HTTP/1.1\r\nHost: svc-a:8080\r\nTransfer-Encoding: chunked\r\n\r\n"+
			"3\r\nabc\r\n3\r\ndef\r\n0\r\n\r\n")
		resp, body := readResponse(t, bufio.NewReader(c), "PUT")
		if resp.StatusCode != 200 || body != "svc-a PUT /chunked abcdef" {
			t.Fatalf("got %d %q", resp.StatusCode, body)
		}
	})

	t.Run("a client that expects 100 Continue gets it from the proxy", func(t *testing.T) {
		c := p.dial(t, "a")
		br := bufio.NewReader(c)
		io.WriteString(c, "POST http://svc-a:8080/expect HTTP/1.1\r\nHost: svc-a:8080\r\nContent-Length: 2\r\nExpect: 100-continue\r\n\r\n")
		line, err := br.ReadString('\n')
		if err != nil || !strings.HasPrefix(line, "HTTP/1.1 100 ") {
			t.Fatalf("want a 100 Continue first, got %q, %v", line, err)
		}
		if _, err := br.ReadString('\n'); err != nil {
			t.Fatal(err)
		}
		io.WriteString(c, "ok")
		resp, body := readResponse(t, br, "POST")
		if resp.StatusCode != 200 || body != "svc-a POST /expect ok" {
			t.Fatalf("got %d %q", resp.StatusCode, body)
		}
	})

	t.Run("an HTTP/1.0 client gets a streamed body unchunked, then the connection closes", func(t *testing.T) {
		c := p.dial(t, "a")
		io.WriteString(c, "GET http://svc-a:8080/stream HTTP/1.0\r\n\r\n")
		raw, err := io.ReadAll(c)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.HasSuffix(string(raw), "\r\n\r\none two three") || strings.Contains(string(raw), "chunked") {
			t.Fatalf("got %q", raw)
		}
	})
}

func TestRequestsThatAreNotProxyRequestsAreRefused(t *testing.T) {
	w := newWorld()
	services(t, w)
	p := start(t, w, Config{Sandboxes: sandboxes(), MaxHeaderBytes: 1024, allowLoopback: true})

	tests := []struct {
		name       string
		request    string
		wantStatus int
		wantBody   string
	}{
		{"an origin-form request is a bad request", "GET /hello HTTP/1.1\r\nHost: svc-a:8080\r\n\r\n", 400, "not a proxy request"},
		{"an asterisk-form request is a bad request", "OPTIONS * HTTP/1.1\r\nHost: svc-a:8080\r\n\r\n", 400, "not a proxy request"},
		{"an https URI must use CONNECT", "GET https://svc-a:8443/ HTTP/1.1\r\nHost: svc-a:8443\r\n\r\n", 400, `use CONNECT for "https"`},
		{"CONNECT needs a port", "CONNECT svc-a HTTP/1.1\r\nHost: svc-a\r\n\r\n", 400, `CONNECT needs host:port, got "svc-a"`},
		{"CONNECT needs a valid port", "CONNECT svc-a:0 HTTP/1.1\r\nHost: svc-a:0\r\n\r\n", 400, `port "0" is not in 1-65535`},
		{"a host name with odd characters is a bad request", "CONNECT svc_a!:8080 HTTP/1.1\r\nHost: x\r\n\r\n", 400, "neither a host name nor an IP address"},
		{"garbage is a bad request", "HELLO\r\n\r\n", 400, "malformed request"},
		{"a header over MaxHeaderBytes is too large", "GET http://svc-a:8080/ HTTP/1.1\r\nX-Big: " + strings.Repeat("x", 8000) + "\r\n\r\n", 431, "request header too large"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := p.dial(t, "a")
			io.WriteString(c, tt.request)
			method, _, _ := strings.Cut(tt.request, " ")
			resp, body := readResponse(t, bufio.NewReader(c), method)
			if resp.StatusCode != tt.wantStatus || !strings.Contains(body, tt.wantBody) {
				t.Fatalf("got %d %q, want %d containing %q", resp.StatusCode, body, tt.wantStatus, tt.wantBody)
			}
			if !resp.Close {
				t.Errorf("want Connection: close")
			}
		})
	}
}

func TestNamesResolvingToAddressesThatAreNotGlobalAreRefused(t *testing.T) {
	w := newWorld()
	w.serveHTTP(t, "svc-a", "127.0.0.2", false, "8080")
	// What a dial of these addresses reaches in this test: the loopback
	// service above (no traffic leaves 127.0.0.0/8).
	for _, addr := range []string{"10.20.30.40:8080", "8.8.8.8:8080", "[2606:4700::1111]:8080", "[64:ff9b::a14:1e28]:8080"} {
		w.route(addr, w.ports["127.0.0.2:8080"])
	}
	w.name("svc-a", "127.0.0.2")
	w.name("localhost", "127.0.0.1", "::1")
	w.name("metadata", "169.254.169.254")
	w.name("metadata6", "fd00:ec2::254")
	w.name("metadata-alibaba", "100.100.100.200")
	w.name("metadata-oracle", "192.0.0.192")
	w.name("linklocal6", "fe80::1")
	w.name("mapped", "::ffff:127.0.0.2")
	w.name("zero", "0.0.0.0")
	w.name("mixed", "169.254.169.254", "10.20.30.40")
	w.name("private", "10.20.30.40")
	w.name("host.attacker.example", "172.17.0.1") // the Docker host, on the default bridge
	w.name("home", "192.168.1.1")
	w.name("cgnat", "100.64.0.1")
	w.name("ula", "fd12:3456::1")
	w.name("bench", "198.18.0.1")
	w.name("class-e", "240.0.0.1")
	w.name("this-network", "0.1.2.3")
	w.name("doc6", "2001:db8::1")
	w.name("compat", "::a00:1")
	w.name("nat64-private", "64:ff9b::10.20.30.40")
	w.name("nat64-metadata", "64:ff9b::169.254.169.254")
	w.name("public", "8.8.8.8")
	w.name("public6", "2606:4700::1111")
	names := []string{"svc-a:8080", "localhost:8080", "metadata:80", "metadata6:80", "metadata-alibaba:80", "metadata-oracle:80", "linklocal6:80",
		"mapped:8080", "zero:8080", "mixed:8080", "private:8080", "*.attacker.example:8080", "home:8080", "cgnat:8080", "ula:8080",
		"bench:8080", "class-e:8080", "this-network:8080", "doc6:8080", "compat:8080", "nat64-private:8080", "nat64-metadata:8080",
		"public:8080", "public6:8080", "127.0.0.2:8080", "10.20.30.40:8080"}
	sb := []Sandbox{
		{Name: "a", Allowed: names},
		{Name: "b", Allowed: names, PrivateRanges: []string{"10.20.0.0/16", "100.64.0.0/10", "192.0.0.0/24", "fd12:3456::/48"}},
	}
	p := start(t, w, Config{Sandboxes: sb}) // the production rule: no loopback targets

	tests := []struct {
		name       string
		sandbox    string
		target     string
		wantStatus int
		wantBody   string
		wantDial   string
	}{
		{"a name resolving to loopback is refused", "a", "svc-a:8080", 403, "svc-a resolves only to refused addresses (127.0.0.2 is loopback)", ""},
		{"localhost is refused in both families", "a", "localhost:8080", 403, "127.0.0.1 is loopback, ::1 is loopback", ""},
		{"a name resolving to the metadata endpoint is refused", "a", "metadata:80", 403, "169.254.169.254 is link-local", ""},
		{"a name resolving to the IPv6 metadata endpoint is refused", "a", "metadata6:80", 403, "fd00:ec2::254 is a cloud metadata endpoint", ""},
		{"a name resolving to an IPv6 link-local address is refused", "a", "linklocal6:80", 403, "fe80::1 is link-local", ""},
		{"an IPv4-mapped loopback address is refused", "a", "mapped:8080", 403, "127.0.0.2 is loopback", ""},
		{"a name resolving to the unspecified address is refused", "a", "zero:8080", 403, "0.0.0.0 is unspecified", ""},
		{"a name resolving to a private address is refused", "a", "private:8080", 403, "10.20.30.40 is private (RFC 1918) and not in the sandbox's private_ranges", ""},
		{"a wildcard name resolving to the Docker host's bridge address is refused", "a", "host.attacker.example:8080", 403, "172.17.0.1 is private (RFC 1918)", ""},
		{"a name resolving to 192.168/16 is refused", "a", "home:8080", 403, "192.168.1.1 is private (RFC 1918)", ""},
		{"a name resolving to carrier-grade NAT space is refused", "a", "cgnat:8080", 403, "100.64.0.1 is shared address space", ""},
		{"a name resolving to a unique local IPv6 address is refused", "a", "ula:8080", 403, "fd12:3456::1 is unique local (fc00::/7)", ""},
		{"a name resolving to the benchmarking range is refused", "a", "bench:8080", 403, "198.18.0.1 is reserved for benchmarking", ""},
		{"a name resolving to 240/4 is refused", "a", "class-e:8080", 403, "240.0.0.1 is reserved (240.0.0.0/4)", ""},
		{"a name resolving to 0/8 is refused", "a", "this-network:8080", 403, `0.1.2.3 is "this network"`, ""},
		{"a name resolving to IPv6 documentation space is refused", "a", "doc6:8080", 403, "2001:db8::1 is reserved for documentation", ""},
		{"a name resolving to IPv6 outside 2000::/3 is refused", "a", "compat:8080", 403, "::a00:1 is reserved (outside the global unicast 2000::/3)", ""},
		{"a NAT64 address is judged by its IPv4 address", "a", "nat64-private:8080", 403, "64:ff9b::a14:1e28 is NAT64 for 10.20.30.40, which is private", ""},
		{"a NAT64 address of the metadata endpoint is refused", "a", "nat64-metadata:8080", 403, "NAT64 for 169.254.169.254, which is link-local", ""},
		{"a name resolving to a public address is dialled", "a", "public:8080", 200, "svc-a GET /", "8.8.8.8:8080"},
		{"a name resolving to a public IPv6 address is dialled", "a", "public6:8080", 200, "svc-a GET /", "[2606:4700::1111]:8080"},
		{"an IP-literal entry may be loopback: the operator chose it", "a", "127.0.0.2:8080", 200, "svc-a GET /", "127.0.0.2:8080"},
		{"an IP-literal entry may be private without a private range", "a", "10.20.30.40:8080", 200, "svc-a GET /", "10.20.30.40:8080"},

		{"a name may resolve to a private address in the sandbox's private ranges", "b", "private:8080", 200, "svc-a GET /", "10.20.30.40:8080"},
		{"a refused address is skipped for an allowed one", "b", "mixed:8080", 200, "svc-a GET /", "10.20.30.40:8080"},
		{"a NAT64 address of a private range is allowed", "b", "nat64-private:8080", 200, "svc-a GET /", "[64:ff9b::a14:1e28]:8080"},
		{"private ranges open only themselves", "b", "host.attacker.example:8080", 403, "172.17.0.1 is private (RFC 1918) and not in the sandbox's private_ranges", ""},
		{"a metadata endpoint inside a private range stays refused", "b", "metadata-alibaba:80", 403, "100.100.100.200 is a cloud metadata endpoint", ""},
		{"Oracle's legacy metadata endpoint inside a private range stays refused", "b", "metadata-oracle:80", 403, "192.0.0.192 is a cloud metadata endpoint", ""},
		{"loopback stays refused with private ranges", "b", "svc-a:8080", 403, "127.0.0.2 is loopback", ""},
		{"the metadata endpoint stays refused with private ranges", "b", "metadata:80", 403, "169.254.169.254 is link-local", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := len(w.dials())
			status, body := p.get(t, tt.sandbox, "connect", tt.target, "/")
			if status != tt.wantStatus || !strings.Contains(body, tt.wantBody) {
				t.Fatalf("got %d %q, want %d containing %q", status, body, tt.wantStatus, tt.wantBody)
			}
			var want []string
			if tt.wantDial != "" {
				want = []string{tt.wantDial}
			}
			if got := w.dials()[before:]; !slices.Equal(got, want) {
				t.Errorf("the proxy dialled %v, want %v", got, want)
			}
			if tt.wantStatus == http.StatusForbidden {
				line := p.waitLogged(t, "proxy: refused", map[string]any{"sandbox": tt.sandbox, "target": tt.target, "status": 403})
				if reason, _ := line["reason"].(string); line["level"] != "WARN" || !strings.Contains(reason, tt.wantBody) {
					t.Errorf("log line %v: want a WARN whose reason contains %q", line, tt.wantBody)
				}
			}
		})
	}
}

func TestNamesAreResolvedFullyQualified(t *testing.T) {
	t.Run("the resolver is asked for the name with its trailing dot", func(t *testing.T) {
		w := newWorld()
		services(t, w)
		p := start(t, w, Config{Sandboxes: sandboxes(), allowLoopback: true})
		if status, body := p.get(t, "a", "connect", "SVC-A:8080", "/fq"); status != 200 || body != "svc-a GET /fq " {
			t.Fatalf("got %d %q", status, body)
		}
		if got := w.lookups(); !slices.Equal(got, []string{"svc-a."}) {
			t.Fatalf("looked up %q, want only \"svc-a.\": a relative name could take a search domain", got)
		}
	})

	t.Run("Go's resolver asks the DNS for the name alone, never under a search domain", func(t *testing.T) {
		w := newWorld()
		srv := w.serveHTTP(t, "svc-a", "127.0.0.2", false)
		_, port, _ := net.SplitHostPort(srv.Listener.Addr().String())
		dns := serveDNS(t, map[string]string{"svc-a.": "127.0.0.2"})
		cfg := Config{Sandboxes: []Sandbox{{Name: "a", Allowed: []string{"svc-a:" + port}}}, Resolver: dns.resolver(), allowLoopback: true}
		p := start(t, nil, cfg) // the default dialer
		if status, body := p.get(t, "a", "connect", "svc-a:"+port, "/dns"); status != 200 || body != "svc-a GET /dns " {
			t.Fatalf("got %d %q", status, body)
		}
		asked := dns.questions()
		if len(asked) == 0 {
			t.Fatal("the DNS server was not asked")
		}
		for _, q := range asked {
			if q != "svc-a." {
				t.Errorf("the DNS was asked for %q; want only svc-a. (A and AAAA)", q)
			}
		}
	})
}

func TestTheDefaultDialerReachesAnIPLiteralEntry(t *testing.T) {
	// An IP-literal entry needs no resolution: the production dialer reaches
	// a loopback service the operator named by address.
	w := newWorld()
	srv := w.serveHTTP(t, "svc-a", "127.0.0.2", false)
	target := srv.Listener.Addr().String()
	sb := []Sandbox{{Name: "a", Allowed: []string{target}}}
	p := start(t, nil, Config{Sandboxes: sb})
	if status, body := p.get(t, "a", "connect", target, "/x"); status != 200 || body != "svc-a GET /x " {
		t.Fatalf("got %d %q", status, body)
	}
}

func TestDialTimeoutIsAGatewayTimeout(t *testing.T) {
	w := newWorld()
	w.name("slow", "10.20.30.40")
	sb := []Sandbox{{Name: "a", Allowed: []string{"slow:443"}, PrivateRanges: []string{"10.20.30.0/24"}}}
	cfg := Config{Sandboxes: sb, DialTimeout: 50 * time.Millisecond,
		Dial: func(ctx context.Context, network, addr string) (net.Conn, error) {
			<-ctx.Done() // a target that never answers
			return nil, ctx.Err()
		}}
	cfg.Resolver = w
	p := start(t, nil, cfg)
	if status, body := p.get(t, "a", "connect", "slow:443", "/"); status != 504 || !strings.Contains(body, "connecting to slow:443 timed out") {
		t.Fatalf("got %d %q, want 504", status, body)
	}
}
