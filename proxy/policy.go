package proxy

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"
)

// target is a host:port a client asked for, or an allowlist entry, in
// canonical form.
type target struct {
	name string     // lower case, no trailing dot; empty for an IP literal
	ip   netip.Addr // valid for an IP literal
	port uint16
}

// String returns the canonical "host:port" form, the key of an allowlist.
func (t target) String() string {
	if t.ip.IsValid() {
		return netip.AddrPortFrom(t.ip, t.port).String()
	}
	return net.JoinHostPort(t.name, strconv.Itoa(int(t.port)))
}

// parseTarget parses host and port (as split by net.SplitHostPort) into a
// canonical target: a DNS name or an IP literal, and a port in 1-65535.
func parseTarget(host, port string) (target, error) {
	p, err := strconv.ParseUint(port, 10, 16)
	if err != nil || p == 0 {
		return target{}, fmt.Errorf("port %q is not in 1-65535", port)
	}
	if ip, err := netip.ParseAddr(host); err == nil {
		if ip.Zone() != "" {
			return target{}, fmt.Errorf("address %s has a zone", host)
		}
		return target{ip: ip.Unmap(), port: uint16(p)}, nil
	}
	name := strings.TrimSuffix(strings.ToLower(host), ".")
	if !validName(name) {
		return target{}, fmt.Errorf("%q is neither a host name nor an IP address", host)
	}
	return target{name: name, port: uint16(p)}, nil
}

// validName reports whether s (lower case) is a DNS name: dot-separated labels
// of 1-63 letters, digits, '-' or '_', not starting or ending with '-', at
// most 253 bytes.
func validName(s string) bool {
	if s == "" || len(s) > 253 {
		return false
	}
	for label := range strings.SplitSeq(s, ".") {
		if label == "" || len(label) > 63 || label[0] == '-' || label[len(label)-1] == '-' {
			return false
		}
		for i := 0; i < len(label); i++ {
			c := label[i]
			if !('a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '-' || c == '_') {
				return false
			}
		}
	}
	return true
}

// sandbox is a validated Sandbox, ready for lookups.
type sandbox struct {
	name     string
	socket   string
	allowed  map[string]bool // canonical "host:port" of exact entries
	suffixes []suffixRule    // "*.example.com:443" entries
	private  []netip.Prefix  // the ranges names may resolve to although not global

	active int // client connections being served; guarded by Server.mu
}

// suffixRule is a "*.example.com:443" entry: suffix ".example.com", port 443.
type suffixRule struct {
	suffix string
	port   uint16
}

// allow adds an allowlist entry. An IP literal must be dialable: not
// unspecified, multicast or broadcast.
func (sb *sandbox) allow(entry string) error {
	host, port, err := net.SplitHostPort(entry)
	if err != nil {
		return errors.New(`not "host:port"`)
	}
	if rest, ok := strings.CutPrefix(host, "*."); ok {
		t, err := parseTarget(rest, port)
		if err != nil {
			return err
		}
		if t.ip.IsValid() {
			return errors.New("a wildcard needs a domain name, not an address")
		}
		sb.suffixes = append(sb.suffixes, suffixRule{suffix: "." + t.name, port: t.port})
		return nil
	}
	t, err := parseTarget(host, port)
	if err != nil {
		return err
	}
	if t.ip.IsValid() {
		if why := literalRefusal(t.ip); why != "" {
			return fmt.Errorf("the address is %s", why)
		}
	}
	sb.allowed[t.String()] = true
	return nil
}

// allows reports whether the sandbox may reach t.
func (sb *sandbox) allows(t target) bool {
	if sb.allowed[t.String()] {
		return true
	}
	if t.ip.IsValid() {
		return false
	}
	for _, r := range sb.suffixes {
		if r.port == t.port && strings.HasSuffix(t.name, r.suffix) {
			return true
		}
	}
	return false
}

// privateRange reports whether a is in one of the sandbox's private ranges.
func (sb *sandbox) privateRange(a netip.Addr) bool {
	for _, p := range sb.private {
		if p.Contains(a) {
			return true
		}
	}
	return false
}
