// Package proxy owns the egress proxy server that runs in the sidecar
// container (`worker proxy`): an HTTP forward proxy that allows only the
// host:port pairs granted to the sandbox whose socket a connection came in on.
//
// It imports only the standard library. It does not create the volumes that
// hold its sockets or start the sidecar (imagebuild does), it does not relay
// TCP inside a sandbox (the harness does), and it does not look inside TLS.
//
// # Who is asking
//
// Sandbox containers have no network at all. The proxy listens on one Unix
// socket per sandbox, and the socket is the sandbox's identity: a connection
// accepted on sandbox X's socket may reach only X's allowlist, never another
// sandbox's nor the union. That holds because of where the sockets are: each
// lies in a Docker volume of its own sandbox, which the sidecar mounts
// read-write and only that sandbox's containers mount, read-only, so that a
// script can connect to its own socket but can neither see another sandbox's
// nor unlink or replace its own. The proxy makes each socket mode 0666, so
// that the sandbox's uid may connect; the volume is the access control.
//
// # Requests
//
//   - "CONNECT host:port" opens a tunnel (for TLS); the port is required.
//   - "GET http://host[:port]/path" (any method, absolute URI) is forwarded, the
//     port defaulting to 80, without its hop-by-hop and Proxy-* headers, over a
//     new connection to the target; the client's connection may stay open for
//     its next request. Protocol upgrades (WebSocket over plain HTTP) are not
//     relayed.
//   - Anything else (an origin-form "GET /", "https://" URIs, which must use
//     CONNECT) is answered 400.
//
// # Allowlist, resolution and refusals
//
// An allowlist entry is "name:port", "ip:port" or "*.domain:port" (see
// Sandbox.Allowed). A request is checked against the entries by the name it
// gives, before anything is resolved; a request for an IP address matches only
// an entry with that address. Then the proxy resolves the name itself (with
// Config.Resolver), fully qualified ("name."), so that no search domain of the
// proxy's host ever applies, and connects to a resolved address, never to one
// the client supplied, so the address checked is the address dialled.
//
// A name may resolve only to globally reachable addresses. Refused always are
// loopback, link-local (169.254.0.0/16, fe80::/10: this covers the cloud
// metadata endpoint 169.254.169.254), other known metadata endpoints
// (fd00:ec2::254, 100.100.100.200, 192.0.0.192), unspecified, multicast and
// broadcast. Refused unless the sandbox's Sandbox.PrivateRanges hold them are
// the other addresses that are not globally reachable: private (10/8,
// 172.16/12, 192.168/16, fc00::/7), shared (100.64/10), 0/8, 192.0.0/24, the
// documentation and benchmarking ranges (198.18/15), 192.88.99/24, 240/4, and
// IPv6 outside 2000::/3 or in its reserved parts (2001::/23, 2001:db8::/32,
// 2002::/16, 3fff::/20). A NAT64 address (64:ff9b::/96) is judged by the IPv4
// address it embeds. So an allowlisted name, or a wildcard, whose DNS an
// attacker controls cannot lead to the Docker host's bridge address or a
// service of the private network unless the operator opened that range for the
// sandbox. A name that resolves only to refused addresses is answered 403,
// with the reason for each address. An IP-literal entry is the operator's
// explicit choice and may be private, loopback or link-local, but never
// unspecified, multicast or broadcast (New rejects such an entry).
//
// # Answers and bounds
//
//	400  not a proxy request, or a malformed one
//	403  the target is not in the sandbox's allowlist; the target resolves
//	     only to refused addresses
//	431  the request header is over Config.MaxHeaderBytes
//	502  the target cannot be resolved or connected to, or answers badly
//	503  over the sandbox's share of connections
//	504  resolving or connecting took over Config.DialTimeout, or the target
//	     sent no response within Config.IdleTimeout
//
// Every refusal is logged at Warn with the sandbox and the target, and
// answered with a short text body naming them; the connection is then closed.
//
// Config.MaxConns is shared out equally: each sandbox may hold MaxConns / the
// number of sandboxes client connections (at most Config.MaxConnsPerSandbox),
// so that no sandbox can keep another from connecting. The containers of one
// sandbox share its share. A request header must arrive within
// Config.HeaderTimeout; a tunnel or a body in which no byte moved either way
// for Config.IdleTimeout is closed. Once the client has ended its side (end of
// stream) of a tunnel or of a forwarded exchange, that time is
// Config.CloseGrace instead, and the target's connection is closed with it: a
// client gone frees its connection within CloseGrace even when the target
// never answers.
package proxy
