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

// nameRefusal returns why an address a name resolved to may not be dialled,
// or "" if it may: everything literalRefusal refuses, plus loopback,
// link-local (169.254.0.0/16 and fe80::/10, which hold the cloud metadata
// endpoints) and the metadata addresses outside them. Other private
// addresses are allowed: the operator named the host.
func (s *Server) nameRefusal(a netip.Addr) string {
	a = a.Unmap()
	switch {
	case a.IsLoopback() && !s.allowLoopback:
		return "loopback"
	case a.IsLinkLocalUnicast():
		return "link-local"
	case metadataAddrs[a]:
		return "a cloud metadata endpoint"
	}
	return literalRefusal(a)
}

// failure is a request the proxy answers with an error status.
type failure struct {
	status int
	reason string // for the response body and the log
	err    error  // the cause, for the log only; may be nil
}

// dialTarget resolves t (unless it is an IP literal), refuses the addresses the
// rules refuse, and connects to the first remaining address that answers.
// Resolution and connection together are bounded by DialTimeout.
func (s *Server) dialTarget(ctx context.Context, t target) (net.Conn, netip.AddrPort, *failure) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.DialTimeout)
	defer cancel()

	var addrs []netip.Addr
	if t.ip.IsValid() {
		if why := literalRefusal(t.ip); why != "" {
			return nil, netip.AddrPort{}, &failure{status: http.StatusForbidden, reason: fmt.Sprintf("%s is %s", t, why)}
		}
		addrs = []netip.Addr{t.ip}
	} else {
		ips, err := s.cfg.Resolver.LookupNetIP(ctx, "ip", t.name)
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
			if why := s.nameRefusal(ip); why != "" {
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
