package proxy

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strings"
)

// metadataAddrs are cloud instance-metadata endpoints outside the link-local
// ranges (169.254.169.254 and 169.254.170.2 are link-local already).
var metadataAddrs = map[netip.Addr]bool{
	netip.MustParseAddr("fd00:ec2::254"):   true, // AWS IMDS over IPv6
	netip.MustParseAddr("100.100.100.200"): true, // Alibaba Cloud
	netip.MustParseAddr("192.0.0.192"):     true, // Oracle Cloud, legacy
}

var broadcast = netip.MustParseAddr("255.255.255.255")

// literalRefusal returns why an address may not be dialled even when the
// allowlist names it as an IP literal, or "" if it may: the unspecified
// address (which Linux takes for a local one), multicast and broadcast.
func literalRefusal(a netip.Addr) string {
	a = a.Unmap()
	switch {
	case a.IsUnspecified():
		return "unspecified"
	case a.IsMulticast():
		return "multicast"
	case a == broadcast:
		return "broadcast"
	}
	return ""
}

// alwaysRefused returns why a name may never resolve to an address, whatever
// the sandbox's private ranges, or "": everything literalRefusal refuses,
// plus loopback, link-local (169.254.0.0/16 and fe80::/10, which hold the
// cloud metadata endpoints) and the metadata addresses outside them.
func alwaysRefused(a netip.Addr) string {
	a = a.Unmap()
	switch {
	case a.IsLoopback():
		return "loopback"
	case a.IsLinkLocalUnicast():
		return "link-local"
	case metadataAddrs[a]:
		return "a cloud metadata endpoint"
	}
	return literalRefusal(a)
}

// nonGlobal are the ranges of addresses that are not globally reachable (the
// IANA special-purpose address registries) besides those alwaysRefused
// refuses: a name resolving to one is refused unless the sandbox's private
// ranges hold it. IPv6 outside 2000::/3 is refused as well (see
// nonGlobalRefusal).
var nonGlobal = []struct {
	prefix netip.Prefix
	what   string
}{
	{netip.MustParsePrefix("0.0.0.0/8"), `"this network" (0.0.0.0/8)`},
	{netip.MustParsePrefix("10.0.0.0/8"), "private (RFC 1918)"},
	{netip.MustParsePrefix("100.64.0.0/10"), "shared address space (100.64.0.0/10, carrier-grade NAT)"},
	{netip.MustParsePrefix("172.16.0.0/12"), "private (RFC 1918)"},
	{netip.MustParsePrefix("192.0.0.0/24"), "reserved for IETF protocol assignments (192.0.0.0/24)"},
	{netip.MustParsePrefix("192.0.2.0/24"), "reserved for documentation (192.0.2.0/24)"},
	{netip.MustParsePrefix("192.88.99.0/24"), "the deprecated 6to4 relay anycast (192.88.99.0/24)"},
	{netip.MustParsePrefix("192.168.0.0/16"), "private (RFC 1918)"},
	{netip.MustParsePrefix("198.18.0.0/15"), "reserved for benchmarking (198.18.0.0/15)"},
	{netip.MustParsePrefix("198.51.100.0/24"), "reserved for documentation (198.51.100.0/24)"},
	{netip.MustParsePrefix("203.0.113.0/24"), "reserved for documentation (203.0.113.0/24)"},
	{netip.MustParsePrefix("240.0.0.0/4"), "reserved (240.0.0.0/4)"},
	{netip.MustParsePrefix("2001::/23"), "reserved for IETF protocol assignments (2001::/23, Teredo's among them)"},
	{netip.MustParsePrefix("2001:db8::/32"), "reserved for documentation (2001:db8::/32)"},
	{netip.MustParsePrefix("2002::/16"), "6to4 (2002::/16)"},
	{netip.MustParsePrefix("3fff::/20"), "reserved for documentation (3fff::/20)"},
	{netip.MustParsePrefix("fc00::/7"), "unique local (fc00::/7)"},
}

var (
	// globalUnicast6 is the only IPv6 space allocated for global unicast.
	globalUnicast6 = netip.MustParsePrefix("2000::/3")
	// nat64 is the well-known NAT64 prefix: its addresses reach the IPv4
	// address in their last 32 bits, which is judged instead.
	nat64 = netip.MustParsePrefix("64:ff9b::/96")
)

// nonGlobalRefusal returns why a is not globally reachable, or "" if it is.
// It assumes alwaysRefused(a) is "".
func nonGlobalRefusal(a netip.Addr) string {
	for _, r := range nonGlobal {
		if r.prefix.Contains(a) {
			return r.what
		}
	}
	switch {
	case a.Is6() && !nat64.Contains(a) && !globalUnicast6.Contains(a):
		return "reserved (outside the global unicast 2000::/3)"
	case !a.IsGlobalUnicast() || a.IsPrivate():
		return "not global unicast"
	}
	return ""
}

// nameRefusal returns why an address a name resolved to may not be dialled
// for sandbox sb, or "" if it may: what alwaysRefused refuses (but loopback in
// tests that allow it), then, unless sb's private ranges hold it, any address
// that is not globally reachable. A NAT64 address (64:ff9b::/96) is refused
// for what its IPv4 address would be, and allowed when either address is in
// the private ranges.
func (s *Server) nameRefusal(sb *sandbox, a netip.Addr) string {
	a = a.Unmap()
	if a.IsLoopback() && s.allowLoopback {
		return ""
	}
	if why := alwaysRefused(a); why != "" {
		return why
	}
	var v4 netip.Addr
	if nat64.Contains(a) {
		b := a.As16()
		v4 = netip.AddrFrom4([4]byte(b[12:]))
		if why := alwaysRefused(v4); why != "" {
			return fmt.Sprintf("NAT64 for %s, which is %s", v4, why)
		}
	}
	if sb.privateRange(a) || v4.IsValid() && sb.privateRange(v4) {
		return ""
	}
	why := nonGlobalRefusal(a)
	if why == "" && v4.IsValid() {
		if w := nonGlobalRefusal(v4); w != "" {
			why = fmt.Sprintf("NAT64 for %s, which is %s", v4, w)
		}
	}
	if why == "" {
		return ""
	}
	return why + " and not in the sandbox's private_ranges"
}

// ParsePrivateRange parses a prefix of Sandbox.PrivateRanges: a CIDR prefix
// ("10.20.0.0/16", "fd12:3456::/48") without bits set past its length, not
// IPv4-mapped IPv6 (write it as IPv4), and not lying wholly in addresses that
// names may never resolve to (loopback, link-local, multicast...), which a
// prefix cannot open; an IP-literal allowlist entry can.
func ParsePrivateRange(s string) (netip.Prefix, error) {
	p, err := netip.ParsePrefix(s)
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("%q is not a CIDR prefix like 10.20.0.0/16", s)
	}
	if p.Addr().Is4In6() {
		return netip.Prefix{}, fmt.Errorf("%q is IPv4-mapped: write it as an IPv4 prefix", s)
	}
	if m := p.Masked(); m != p {
		return netip.Prefix{}, fmt.Errorf("%q has bits set past /%d: write %s", s, p.Bits(), m)
	}
	if first, last := p.Addr(), lastAddr(p); alwaysRefused(first) != "" && alwaysRefused(first) == alwaysRefused(last) {
		return netip.Prefix{}, fmt.Errorf("%q holds nothing a name may resolve to (%s is %s): name such an address as an IP literal in the allowlist instead", s, first, alwaysRefused(first))
	}
	return p, nil
}

// lastAddr is the last address of a masked prefix.
func lastAddr(p netip.Prefix) netip.Addr {
	b := p.Addr().AsSlice()
	for i := p.Bits(); i < len(b)*8; i++ {
		b[i/8] |= 0x80 >> (i % 8)
	}
	a, _ := netip.AddrFromSlice(b)
	return a
}

// failure is a request the proxy answers with an error status.
type failure struct {
	status int
	reason string // for the response body and the log
	err    error  // the cause, for the log only; may be nil
}

// dialTarget resolves t (unless it is an IP literal) as a fully qualified
// name, refuses the addresses the rules refuse for sandbox sb, and connects to the first remaining address that answers.
// Resolution and connection together are bounded by DialTimeout.
func (s *Server) dialTarget(ctx context.Context, sb *sandbox, t target) (net.Conn, netip.AddrPort, *failure) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.DialTimeout)
	defer cancel()

	var addrs []netip.Addr
	if t.ip.IsValid() {
		if why := literalRefusal(t.ip); why != "" {
			return nil, netip.AddrPort{}, &failure{status: http.StatusForbidden, reason: fmt.Sprintf("%s is %s", t, why)}
		}
		addrs = []netip.Addr{t.ip}
	} else {
		// Fully qualified: the sidecar's search domains never apply.
		ips, err := s.cfg.Resolver.LookupNetIP(ctx, "ip", t.name+".")
		if err != nil {
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				return nil, netip.AddrPort{}, &failure{status: http.StatusGatewayTimeout, reason: fmt.Sprintf("resolving %s timed out", t.name), err: err}
			}
			return nil, netip.AddrPort{}, &failure{status: http.StatusBadGateway, reason: fmt.Sprintf("cannot resolve %s", t.name), err: err}
		}
		var refused []string
		seen := map[netip.Addr]bool{}
		for _, ip := range ips {
			ip = ip.Unmap().WithZone("")
			if seen[ip] {
				continue
			}
			seen[ip] = true
			if why := s.nameRefusal(sb, ip); why != "" {
				refused = append(refused, fmt.Sprintf("%s is %s", ip, why))
				continue
			}
			addrs = append(addrs, ip)
		}
		if len(addrs) == 0 {
			if len(refused) == 0 {
				return nil, netip.AddrPort{}, &failure{status: http.StatusBadGateway, reason: fmt.Sprintf("%s has no address", t.name)}
			}
			return nil, netip.AddrPort{}, &failure{status: http.StatusForbidden, reason: fmt.Sprintf("%s resolves only to refused addresses (%s)", t.name, strings.Join(refused, ", "))}
		}
	}

	var lastErr error
	for _, a := range addrs {
		ap := netip.AddrPortFrom(a, t.port)
		c, err := s.cfg.Dial(ctx, "tcp", ap.String())
		if err == nil {
			return c, ap, nil
		}
		lastErr = err
		if ctx.Err() != nil {
			break
		}
	}
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return nil, netip.AddrPort{}, &failure{status: http.StatusGatewayTimeout, reason: fmt.Sprintf("connecting to %s timed out", t), err: lastErr}
	}
	return nil, netip.AddrPort{}, &failure{status: http.StatusBadGateway, reason: fmt.Sprintf("cannot connect to %s", t), err: lastErr}
}
