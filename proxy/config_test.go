package proxy

import (
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"
)

func TestParseConfigReadsEveryField(t *testing.T) {
	cfg, err := ParseConfig([]byte(`{
		"max_conns": 100,
		"max_conns_per_sandbox": 10,
		"idle_timeout": "2m",
		"close_grace": "2s",
		"dial_timeout": "5s",
		"header_timeout": "3s",
		"max_header_bytes": 4096,
		"sandboxes": [
			{"name": "a", "socket": "/run/jazzmine/egress/a/proxy.sock", "allowed": ["svc-a:8080", "*.example.com:443"], "private_ranges": ["10.20.0.0/16", "fd12:3456::/48"]},
			{"name": "b_2", "socket": "/run/jazzmine/egress/b_2/proxy.sock", "allowed": ["10.0.0.5:80", "[2001:db8::1]:443"]},
			{"name": "c", "socket": "/run/jazzmine/egress/c/proxy.sock"}
		]
	}`))
	if err != nil {
		t.Fatal(err)
	}
	want := Config{
		MaxConns:           100,
		MaxConnsPerSandbox: 10,
		IdleTimeout:        2 * time.Minute,
		CloseGrace:         2 * time.Second,
		DialTimeout:        5 * time.Second,
		HeaderTimeout:      3 * time.Second,
		MaxHeaderBytes:     4096,
		Sandboxes: []Sandbox{
			{Name: "a", Socket: "/run/jazzmine/egress/a/proxy.sock", Allowed: []string{"svc-a:8080", "*.example.com:443"}, PrivateRanges: []string{"10.20.0.0/16", "fd12:3456::/48"}},
			{Name: "b_2", Socket: "/run/jazzmine/egress/b_2/proxy.sock", Allowed: []string{"10.0.0.5:80", "[2001:db8::1]:443"}},
			{Name: "c", Socket: "/run/jazzmine/egress/c/proxy.sock"},
		},
	}
	if !reflect.DeepEqual(cfg, want) {
		t.Fatalf("got %+v\nwant %+v", cfg, want)
	}
	if _, err := New(cfg); err != nil {
		t.Fatalf("New of a parsed config: %v", err)
	}
}

func TestParseConfigNamesTheBadField(t *testing.T) {
	tests := []struct {
		name string
		json string
		want string
	}{
		{"a config without sandboxes is refused", `{}`, "sandboxes: at least one sandbox is required"},
		{"malformed JSON is refused", `{"sandboxes": [`, "unexpected EOF"},
		{"data after the object is refused", `{"sandboxes": [{"name": "a", "socket": "/s/a.sock"}]} {}`, "data after the JSON object"},
		{"an unknown field is refused", `{"listen": ":3128"}`, `unknown field "listen"`},
		{"a field of the wrong type is named", `{"max_conns": "many"}`, "max_conns: a JSON string cannot be a int"},
		{"a negative cap is refused", `{"max_conns": -1, "sandboxes": [{"name": "a", "socket": "/s/a.sock"}]}`, "max_conns: must not be negative"},
		{"a bad duration is named", `{"idle_timeout": "soon"}`, `idle_timeout: "soon" is not a duration`},
		{"a negative duration is refused", `{"dial_timeout": "-1s", "sandboxes": [{"name": "a", "socket": "/s/a.sock"}]}`, "dial_timeout: must not be negative"},
		{"a bad sandbox name is named", `{"sandboxes": [{"name": "a b", "socket": "/s/a.sock"}]}`, `sandboxes[0].name: "a b" does not match`},
		{"a missing sandbox name is refused", `{"sandboxes": [{"socket": "/s/a.sock"}]}`, `sandboxes[0].name: "" does not match`},
		{"a sandbox listed twice is refused", `{"sandboxes": [{"name": "a", "socket": "/s/a.sock"}, {"name": "a", "socket": "/s/b.sock"}]}`, `sandboxes[1].name: sandbox "a" is listed twice`},
		{"a sandbox without a socket is refused", `{"sandboxes": [{"name": "a"}]}`, `sandboxes[0].socket: sandbox "a" needs a socket`},
		{"a relative socket path is refused", `{"sandboxes": [{"name": "a", "socket": "run/a.sock"}]}`, `sandboxes[0].socket: "run/a.sock" is not a clean absolute path`},
		{"a socket path with dot-dot is refused", `{"sandboxes": [{"name": "a", "socket": "/run/x/../a.sock"}]}`, `sandboxes[0].socket: "/run/x/../a.sock" is not a clean absolute path`},
		{"a socket path too long for a Unix socket is refused", `{"sandboxes": [{"name": "a", "socket": "/` + strings.Repeat("x", 107) + `"}]}`, "longer than a Unix socket path may be (107 bytes)"},
		{"two sandboxes on one socket are refused", `{"sandboxes": [{"name": "a", "socket": "/s/a.sock"}, {"name": "b", "socket": "/s/a.sock"}]}`, `sandboxes[1].socket: "/s/a.sock" is the socket of another sandbox`},
		{"an entry without a port is refused", `{"sandboxes": [{"name": "a", "socket": "/s/a.sock", "allowed": ["svc-a"]}]}`, `sandboxes[0].allowed[0]: "svc-a": not "host:port"`},
		{"port 0 is refused", `{"sandboxes": [{"name": "a", "socket": "/s/a.sock", "allowed": ["ok:80", "svc-a:0"]}]}`, `sandboxes[0].allowed[1]: "svc-a:0": port "0" is not in 1-65535`},
		{"a port over 65535 is refused", `{"sandboxes": [{"name": "a", "socket": "/s/a.sock", "allowed": ["svc-a:70000"]}]}`, `port "70000" is not in 1-65535`},
		{"a named port is refused", `{"sandboxes": [{"name": "a", "socket": "/s/a.sock", "allowed": ["svc-a:https"]}]}`, `port "https" is not in 1-65535`},
		{"a host with odd characters is refused", `{"sandboxes": [{"name": "a", "socket": "/s/a.sock", "allowed": ["svc a:80"]}]}`, `"svc a" is neither a host name nor an IP address`},
		{"a wildcard in the middle is refused", `{"sandboxes": [{"name": "a", "socket": "/s/a.sock", "allowed": ["api.*.com:443"]}]}`, `"api.*.com" is neither a host name nor an IP address`},
		{"a wildcard over an address is refused", `{"sandboxes": [{"name": "a", "socket": "/s/a.sock", "allowed": ["*.10.0.0.1:443"]}]}`, "a wildcard needs a domain name"},
		{"the unspecified address is refused", `{"sandboxes": [{"name": "a", "socket": "/s/a.sock", "allowed": ["0.0.0.0:80"]}]}`, "the address is unspecified"},
		{"a multicast address is refused", `{"sandboxes": [{"name": "a", "socket": "/s/a.sock", "allowed": ["[ff02::1]:80"]}]}`, "the address is multicast"},
		{"a bad close grace is named", `{"close_grace": "-1s", "sandboxes": [{"name": "a", "socket": "/s/a.sock"}]}`, "close_grace: must not be negative"},
		{"fewer connections than sandboxes are refused", `{"max_conns": 1, "sandboxes": [{"name": "a", "socket": "/s/a.sock"}, {"name": "b", "socket": "/s/b.sock"}]}`, "max_conns: 1 is fewer than the sandboxes (2)"},
		{"a private range that is not a prefix is named", `{"sandboxes": [{"name": "a", "socket": "/s/a.sock", "private_ranges": ["10.20.0.0/16", "10.0.0.1"]}]}`, `sandboxes[0].private_ranges[1]: "10.0.0.1" is not a CIDR prefix`},
		{"the broadcast address is refused", `{"sandboxes": [{"name": "b", "socket": "/s/b.sock", "allowed": ["255.255.255.255:80"]}]}`, `sandboxes[0].allowed[0]: "255.255.255.255:80": the address is broadcast`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ParseConfig([]byte(tt.json))
			if !errors.Is(err, ErrInvalidConfig) {
				t.Fatalf("got %v, want an error wrapping ErrInvalidConfig", err)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("got %q, want it to contain %q", err, tt.want)
			}
		})
	}
}

func TestNewAppliesTheDefaults(t *testing.T) {
	srv, err := New(Config{Sandboxes: []Sandbox{{Name: "a"}}})
	if err != nil {
		t.Fatal(err)
	}
	c := srv.cfg
	if c.MaxConns != 256 || c.MaxConnsPerSandbox != 64 || srv.perSandbox != 64 || c.IdleTimeout != 60*time.Second || c.CloseGrace != 5*time.Second ||
		c.DialTimeout != 10*time.Second || c.HeaderTimeout != 10*time.Second || c.MaxHeaderBytes != 64<<10 ||
		c.Resolver == nil || c.Dial == nil || c.Logger == nil || srv.allowLoopback {
		t.Fatalf("defaults: %+v", c)
	}
	if _, err := New(Config{}); !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("New of an empty config: got %v, want ErrInvalidConfig", err)
	}
}

func TestAllowlistEntriesMatchExactly(t *testing.T) {
	sb := &sandbox{name: "a", allowed: map[string]bool{}}
	for _, e := range []string{"svc-a:8080", "API.Example.com.:443", "*.corp.test:443", "10.0.0.5:80", "[2001:db8::1]:443"} {
		if err := sb.allow(e); err != nil {
			t.Fatalf("%s: %v", e, err)
		}
	}
	tests := []struct {
		name   string
		host   string
		port   string
		allows bool
	}{
		{"the exact name and port match", "svc-a", "8080", true},
		{"the name matches in any case", "SVC-A", "8080", true},
		{"another port does not match", "svc-a", "8081", false},
		{"a longer name does not match", "svc-a.evil.test", "8080", false},
		{"a name ending like an entry does not match", "xsvc-a", "8080", false},
		{"an entry's trailing dot and case are ignored", "api.example.com", "443", true},
		{"a wildcard matches one label below its domain", "eu.corp.test", "443", true},
		{"a wildcard matches several labels below its domain", "a.b.corp.test", "443", true},
		{"a wildcard does not match its domain", "corp.test", "443", false},
		{"a wildcard does not match a name that only ends like it", "evilcorp.test", "443", false},
		{"a wildcard does not match another port", "eu.corp.test", "80", false},
		{"an address matches its entry", "10.0.0.5", "80", true},
		{"an IPv4-mapped address matches the IPv4 entry", "::ffff:10.0.0.5", "80", true},
		{"an IPv6 address matches its entry", "2001:db8:0::1", "443", true},
		{"another address does not match", "10.0.0.6", "80", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tg, err := parseTarget(tt.host, tt.port)
			if err != nil {
				t.Fatal(err)
			}
			if got := sb.allows(tg); got != tt.allows {
				t.Fatalf("allows(%s) = %v, want %v", tg, got, tt.allows)
			}
		})
	}
}

func TestParsePrivateRangeTakesOnlyPrefixesThatCanOpenSomething(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want string // the error, or "" for the prefix back
	}{
		{"an RFC 1918 prefix is taken", "10.20.0.0/16", ""},
		{"a unique local IPv6 prefix is taken", "fd12:3456::/48", ""},
		{"a single address is taken", "172.17.0.5/32", ""},
		{"a prefix over loopback and more is taken (loopback stays refused)", "0.0.0.0/0", ""},
		{"an address without a length is refused", "10.0.0.1", `"10.0.0.1" is not a CIDR prefix like 10.20.0.0/16`},
		{"a name is refused", "svc-a/16", "is not a CIDR prefix"},
		{"bits past the length are refused with the prefix meant", "10.20.30.40/16", `"10.20.30.40/16" has bits set past /16: write 10.20.0.0/16`},
		{"an IPv4-mapped prefix is refused", "::ffff:10.0.0.0/104", "is IPv4-mapped: write it as an IPv4 prefix"},
		{"a loopback prefix is refused", "127.0.0.0/8", `"127.0.0.0/8" holds nothing a name may resolve to (127.0.0.0 is loopback)`},
		{"a prefix inside link-local is refused", "169.254.169.0/24", "(169.254.169.0 is link-local)"},
		{"the IPv6 metadata endpoint is refused", "fd00:ec2::254/128", "(fd00:ec2::254 is a cloud metadata endpoint)"},
		{"a multicast prefix is refused", "ff02::/16", "(ff02:: is multicast)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := ParsePrivateRange(tt.in)
			if tt.want == "" {
				if err != nil || p.String() != tt.in {
					t.Fatalf("got %v, %v; want %s", p, err, tt.in)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("got %v, %v; want an error containing %q", p, err, tt.want)
			}
		})
	}
}
