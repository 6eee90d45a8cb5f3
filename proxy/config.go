package proxy

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"path/filepath"
	"regexp"
	"time"
)

// Defaults of Config; a zero field means its default.
const (
	// DefaultMaxConns caps the client connections of all sandboxes together; it
	// is shared out equally among the sandboxes (see Config.MaxConns).
	DefaultMaxConns = 256
	// DefaultMaxConnsPerSandbox caps the client connections of one sandbox, when
	// its equal share of MaxConns is larger.
	DefaultMaxConnsPerSandbox = 64
	// DefaultIdleTimeout closes a tunnel, or a request or response body, that
	// moved no byte in either direction for this long. It also bounds how long an
	// idle keep-alive connection waits for its next request.
	DefaultIdleTimeout = 60 * time.Second
	// DefaultCloseGrace closes a tunnel or a forwarded exchange whose client has
	// ended its side, once no byte moved either way for this long.
	DefaultCloseGrace = 5 * time.Second
	// DefaultDialTimeout bounds resolving a target's name plus connecting to it.
	DefaultDialTimeout = 10 * time.Second
	// DefaultHeaderTimeout bounds reading a request's header.
	DefaultHeaderTimeout = 10 * time.Second
	// DefaultMaxHeaderBytes bounds the size of a request's header.
	DefaultMaxHeaderBytes = 64 << 10
)

// ConfigEnv is the environment variable Main reads the JSON config from.
const ConfigEnv = "JAZZMINE_PROXY_CONFIG"

// ErrInvalidConfig is wrapped by every error of ParseConfig and New about the
// config itself; the message names the field, as spelt in the JSON form
// ("sandboxes[0].allowed[1]").
var ErrInvalidConfig = errors.New("proxy: invalid config")

// Resolver resolves a host name to its addresses; *net.Resolver implements it.
// The proxy calls it with network "ip".
type Resolver interface {
	LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error)
}

// Sandbox is one sandbox's socket and egress allowlist. A connection accepted
// on the sandbox's socket belongs to the sandbox, and may reach only the
// targets of Allowed.
type Sandbox struct {
	// Name identifies the sandbox in responses and logs; it matches
	// ^[A-Za-z0-9_-]{1,64}$ and is unique. Required.
	Name string
	// Socket is the path of the Unix socket ListenAndServe listens on for the
	// sandbox: an absolute path, unique, in a directory that exists and that
	// only the sandbox's containers can see (see the package doc). ListenAndServe
	// and the JSON form require it; empty means the sandbox is served only
	// through Serve, on a listener of the caller's.
	Socket string
	// Allowed are the "host:port" targets the sandbox may reach. host is a DNS
	// name, matched exactly and case-insensitively (a trailing dot is ignored);
	// an IP literal ("10.0.0.5:80", "[2001:db8::1]:443"), matched as an address;
	// or "*.example.com", which matches every name below example.com (at any
	// depth) but not example.com itself. The port is required and exact. Empty
	// means every target is refused.
	Allowed []string
	// PrivateRanges are CIDR prefixes ("10.20.0.0/16", "fd12:3456::/48") that
	// the names of Allowed may resolve to although they are not globally
	// reachable (private, shared, reserved: see the package doc). Loopback,
	// link-local, metadata, multicast and the like stay refused for names
	// whatever the prefixes say. A prefix must have no bits set past its length
	// and may not lie wholly in addresses that are always refused (see
	// ParsePrivateRange). Empty means names resolve only to global addresses.
	// IP-literal entries of Allowed need no prefix.
	PrivateRanges []string
}

// Config configures a Server. The zero value of each field means its default.
type Config struct {
	// Sandboxes are the sandboxes the proxy serves; at least one is required.
	Sandboxes []Sandbox
	// MaxConns caps the client connections being served, all sandboxes
	// together. It is shared out equally: each sandbox may hold at most
	// MaxConns / len(Sandboxes) connections (and MaxConnsPerSandbox), so that
	// the sandboxes together never hold MaxConns and none can keep another from
	// connecting. It must be at least len(Sandboxes). Default DefaultMaxConns.
	MaxConns int
	// MaxConnsPerSandbox caps the client connections of each sandbox when its
	// share of MaxConns is larger; a connection over a sandbox's cap is answered
	// 503 and closed. Default DefaultMaxConnsPerSandbox.
	MaxConnsPerSandbox int
	// IdleTimeout closes a tunnel, or a plain HTTP exchange, in which no byte
	// moved in either direction for this long, and a keep-alive connection that
	// sends no next request for this long. Default DefaultIdleTimeout.
	IdleTimeout time.Duration
	// CloseGrace replaces IdleTimeout for a tunnel or a forwarded exchange once
	// its client has ended its side (end of stream): the tunnel or exchange is
	// closed, upstream connection included, when no byte moved either way for
	// CloseGrace since then, so that a client that went away frees its
	// connection within CloseGrace. Default DefaultCloseGrace.
	CloseGrace time.Duration
	// DialTimeout bounds resolving a target and connecting to it; a timeout is
	// answered 504. Default DefaultDialTimeout.
	DialTimeout time.Duration
	// HeaderTimeout bounds reading a request's header; a client slower than
	// that is disconnected. Default DefaultHeaderTimeout.
	HeaderTimeout time.Duration
	// MaxHeaderBytes bounds a request's header; a larger one is answered 431.
	// Default DefaultMaxHeaderBytes.
	MaxHeaderBytes int
	// Resolver resolves target names; nil means net.DefaultResolver.
	Resolver Resolver
	// Dial connects to a resolved target ("ip:port", network "tcp"); nil means
	// a net.Dialer's DialContext. The context carries DialTimeout.
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
	// Logger receives a Warn line for every refusal and an Info line for every
	// finished tunnel or request; nil means slog.Default().
	Logger *slog.Logger

	// allowLoopback lets names resolve to loopback targets. Tests only: their
	// upstream servers listen on 127.0.0.0/8; production always refuses them.
	allowLoopback bool
}

var sandboxName = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)

// maxSocketPath is the longest path a Unix socket may have on Linux (sun_path
// holds 108 bytes, the last a NUL).
const maxSocketPath = 107

// ParseConfig parses the JSON form of a Config (as passed in ConfigEnv) and
// validates it the way New does. Every field but sandboxes, and their names and
// sockets, is optional, and an unknown field is an error:
//
//	{
//	  "max_conns": 256,
//	  "max_conns_per_sandbox": 64,
//	  "idle_timeout": "60s",
//	  "close_grace": "5s",
//	  "dial_timeout": "10s",
//	  "header_timeout": "10s",
//	  "max_header_bytes": 65536,
//	  "sandboxes": [
//	    {"name": "a", "socket": "/run/jazzmine/egress/a/proxy.sock", "allowed": ["svc-a:8080", "*.example.com:443"],
//	     "private_ranges": ["10.20.0.0/16"]}
//	  ]
//	}
//
// Durations are Go duration strings ("1m30s"). Errors wrap ErrInvalidConfig
// and name the field ("sandboxes[0].socket").
func ParseConfig(data []byte) (Config, error) {
	var j struct {
		MaxConns           int    `json:"max_conns"`
		MaxConnsPerSandbox int    `json:"max_conns_per_sandbox"`
		IdleTimeout        string `json:"idle_timeout"`
		CloseGrace         string `json:"close_grace"`
		DialTimeout        string `json:"dial_timeout"`
		HeaderTimeout      string `json:"header_timeout"`
		MaxHeaderBytes     int    `json:"max_header_bytes"`
		Sandboxes          []struct {
			Name          string   `json:"name"`
			Socket        string   `json:"socket"`
			Allowed       []string `json:"allowed"`
			PrivateRanges []string `json:"private_ranges"`
		} `json:"sandboxes"`
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&j); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) && te.Field != "" {
			return Config{}, fmt.Errorf("%w: %s: a JSON %s cannot be a %s", ErrInvalidConfig, te.Field, te.Value, te.Type)
		}
		return Config{}, fmt.Errorf("%w: %v", ErrInvalidConfig, err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return Config{}, fmt.Errorf("%w: data after the JSON object", ErrInvalidConfig)
	}

	cfg := Config{
		MaxConns:           j.MaxConns,
		MaxConnsPerSandbox: j.MaxConnsPerSandbox,
		MaxHeaderBytes:     j.MaxHeaderBytes,
	}
	for _, d := range []struct {
		field string
		text  string
		to    *time.Duration
	}{
		{"idle_timeout", j.IdleTimeout, &cfg.IdleTimeout},
		{"close_grace", j.CloseGrace, &cfg.CloseGrace},
		{"dial_timeout", j.DialTimeout, &cfg.DialTimeout},
		{"header_timeout", j.HeaderTimeout, &cfg.HeaderTimeout},
	} {
		if d.text == "" {
			continue
		}
		v, err := time.ParseDuration(d.text)
		if err != nil {
			return Config{}, configError(d.field, "%q is not a duration (like \"60s\")", d.text)
		}
		*d.to = v
	}
	for _, js := range j.Sandboxes {
		cfg.Sandboxes = append(cfg.Sandboxes, Sandbox{Name: js.Name, Socket: js.Socket, Allowed: js.Allowed, PrivateRanges: js.PrivateRanges})
	}
	if _, err := compile(cfg.withDefaults()); err != nil {
		return Config{}, err
	}
	for i, sb := range cfg.Sandboxes {
		if sb.Socket == "" {
			return Config{}, configError(fmt.Sprintf("sandboxes[%d].socket", i), "sandbox %q needs a socket", sb.Name)
		}
	}
	return cfg, nil
}

// configError is an error about one field of the config.
func configError(field, format string, args ...any) error {
	return fmt.Errorf("%w: %s: %s", ErrInvalidConfig, field, fmt.Sprintf(format, args...))
}

// withDefaults returns cfg with its zero fields set to their defaults.
func (cfg Config) withDefaults() Config {
	if cfg.MaxConns == 0 {
		cfg.MaxConns = DefaultMaxConns
	}
	if cfg.MaxConnsPerSandbox == 0 {
		cfg.MaxConnsPerSandbox = DefaultMaxConnsPerSandbox
	}
	if cfg.IdleTimeout == 0 {
		cfg.IdleTimeout = DefaultIdleTimeout
	}
	if cfg.CloseGrace == 0 {
		cfg.CloseGrace = DefaultCloseGrace
	}
	if cfg.DialTimeout == 0 {
		cfg.DialTimeout = DefaultDialTimeout
	}
	if cfg.HeaderTimeout == 0 {
		cfg.HeaderTimeout = DefaultHeaderTimeout
	}
	if cfg.MaxHeaderBytes == 0 {
		cfg.MaxHeaderBytes = DefaultMaxHeaderBytes
	}
	if cfg.Resolver == nil {
		cfg.Resolver = net.DefaultResolver
	}
	if cfg.Dial == nil {
		cfg.Dial = (&net.Dialer{}).DialContext
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return cfg
}

// compile validates cfg, its defaults applied (withDefaults leaves a negative
// field negative), and returns its sandboxes ready for lookups.
func compile(cfg Config) ([]*sandbox, error) {
	for _, n := range []struct {
		field string
		v     int64
	}{
		{"max_conns", int64(cfg.MaxConns)},
		{"max_conns_per_sandbox", int64(cfg.MaxConnsPerSandbox)},
		{"max_header_bytes", int64(cfg.MaxHeaderBytes)},
		{"idle_timeout", int64(cfg.IdleTimeout)},
		{"close_grace", int64(cfg.CloseGrace)},
		{"dial_timeout", int64(cfg.DialTimeout)},
		{"header_timeout", int64(cfg.HeaderTimeout)},
	} {
		if n.v < 0 {
			return nil, configError(n.field, "must not be negative")
		}
	}
	if len(cfg.Sandboxes) == 0 {
		return nil, configError("sandboxes", "at least one sandbox is required")
	}
	if cfg.MaxConns < len(cfg.Sandboxes) {
		return nil, configError("max_conns", "%d is fewer than the sandboxes (%d): each sandbox needs a share of at least one connection", cfg.MaxConns, len(cfg.Sandboxes))
	}

	var out []*sandbox
	names, sockets := map[string]bool{}, map[string]bool{}
	for i, s := range cfg.Sandboxes {
		field := fmt.Sprintf("sandboxes[%d]", i)
		if !sandboxName.MatchString(s.Name) {
			return nil, configError(field+".name", "%q does not match ^[A-Za-z0-9_-]{1,64}$", s.Name)
		}
		if names[s.Name] {
			return nil, configError(field+".name", "sandbox %q is listed twice", s.Name)
		}
		names[s.Name] = true
		if s.Socket != "" {
			f := field + ".socket"
			if !filepath.IsAbs(s.Socket) || filepath.Clean(s.Socket) != s.Socket {
				return nil, configError(f, "%q is not a clean absolute path", s.Socket)
			}
			if len(s.Socket) > maxSocketPath {
				return nil, configError(f, "%q is longer than a Unix socket path may be (%d bytes)", s.Socket, maxSocketPath)
			}
			if sockets[s.Socket] {
				return nil, configError(f, "%q is the socket of another sandbox", s.Socket)
			}
			sockets[s.Socket] = true
		}
		sb := &sandbox{name: s.Name, socket: s.Socket, allowed: map[string]bool{}}
		for k, entry := range s.Allowed {
			if err := sb.allow(entry); err != nil {
				return nil, configError(fmt.Sprintf("%s.allowed[%d]", field, k), "%q: %v", entry, err)
			}
		}
		for k, r := range s.PrivateRanges {
			p, err := ParsePrivateRange(r)
			if err != nil {
				return nil, configError(fmt.Sprintf("%s.private_ranges[%d]", field, k), "%v", err)
			}
			sb.private = append(sb.private, p)
		}
		out = append(out, sb)
	}
	return out, nil
}
