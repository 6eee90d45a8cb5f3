package proxy

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"
)

// Server is the egress proxy. Create it with New; it is safe for concurrent
// use, and Serve may run on several listeners at once (the connection caps are
// shared).
type Server struct {
	cfg           Config // defaults applied
	sandboxes     []*sandbox
	allowLoopback bool
	log           *slog.Logger

	mu     sync.Mutex // guards active and every sandbox's active
	active int

	rejecting atomic.Int64 // connections being answered 403/503 outside the caps
}

// New validates cfg and returns a Server. Config errors wrap ErrInvalidConfig.
func New(cfg Config) (*Server, error) {
	sandboxes, err := compile(cfg)
	if err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	return &Server{
		cfg:           cfg,
		sandboxes:     sandboxes,
		allowLoopback: cfg.allowLoopback,
		log:           cfg.Logger,
	}, nil
}

// ListenAndServe listens on Config.Listen and serves until ctx ends; see Serve.
func (s *Server) ListenAndServe(ctx context.Context) error {
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", s.cfg.Listen)
	if err != nil {
		return fmt.Errorf("proxy: listen on %s: %w", s.cfg.Listen, err)
	}
	return s.Serve(ctx, ln)
}

// Serve accepts connections on ln and serves them until ctx ends. Then it
// closes ln and every connection it serves (client and upstream) at once,
// without waiting for requests under way, waits for all its goroutines, and
// returns nil. Serve owns ln and closes it on every return. If ln is closed by
// someone else, Serve ends the same way and returns that error; other accept
// errors (out of file descriptors) are logged and retried after a pause.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	ctx, cancel := context.WithCancel(ctx)
	tr := &tracker{conns: map[net.Conn]struct{}{}}
	var wg sync.WaitGroup
	wg.Go(func() {
		<-ctx.Done() // the caller's, or cancel below on any return
		ln.Close()
		tr.closeAll()
	})
	defer func() {
		cancel()
		wg.Wait()
	}()

	names := make([]string, len(s.sandboxes))
	for i, sb := range s.sandboxes {
		names[i] = sb.name
	}
	s.log.Info("proxy: listening", "addr", ln.Addr().String(), "sandboxes", names)

	var backoff time.Duration
	for {
		c, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			if errors.Is(err, net.ErrClosed) {
				return fmt.Errorf("proxy: accept: %w", err)
			}
			// Out of file descriptors and the like: wait and retry.
			backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
			s.log.Error("proxy: accept", "err", err, "retry_in", backoff)
			t := time.NewTimer(backoff)
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
				return nil
			}
			continue
		}
		backoff = 0
		if !tr.add(c) {
			c.Close()
			continue
		}
		wg.Go(func() {
			defer tr.remove(c)
			defer c.Close()
			s.handle(ctx, tr, c)
		})
	}
}

// handle identifies the sandbox of a new connection by its source address and
// serves it within the connection caps.
func (s *Server) handle(ctx context.Context, tr *tracker, c net.Conn) {
	src := sourceOf(c)
	sb := inSubnets(src.Addr(), s.sandboxes)
	if sb == nil {
		s.log.Warn("proxy: refused a source outside every sandbox network", "source", src.String())
		s.reject(c, http.StatusForbidden, fmt.Sprintf("source %s is in no sandbox network", src.Addr()))
		return
	}
	if why := s.acquire(sb); why != "" {
		s.log.Warn("proxy: refused a connection over the cap", "sandbox", sb.name, "source", src.String(), "reason", why)
		s.reject(c, http.StatusServiceUnavailable, why)
		return
	}
	defer s.release(sb)
	(&session{srv: s, ctx: ctx, tr: tr, conn: c, src: src, sb: sb}).serve()
}

// acquire counts a connection of sb against the caps; it returns why the
// connection is over a cap, or "" once it is counted.
func (s *Server) acquire(sb *sandbox) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.active >= s.cfg.MaxConns {
		return fmt.Sprintf("too many connections (%d)", s.cfg.MaxConns)
	}
	if sb.active >= s.cfg.MaxConnsPerSandbox {
		return fmt.Sprintf("too many connections from sandbox %q (%d)", sb.name, s.cfg.MaxConnsPerSandbox)
	}
	s.active++
	sb.active++
	return ""
}

// release uncounts a connection that acquire counted.
func (s *Server) release(sb *sandbox) {
	s.mu.Lock()
	s.active--
	sb.active--
	s.mu.Unlock()
}

// reject answers a connection that is not served (unknown source, over a cap)
// without reading its request, then closes it gracefully. Past MaxConns such
// connections at once, further ones are closed without an answer.
func (s *Server) reject(c net.Conn, status int, reason string) {
	if s.rejecting.Add(1) > int64(s.cfg.MaxConns) {
		s.rejecting.Add(-1)
		return
	}
	defer s.rejecting.Add(-1)
	s.replyAndClose(c, status, reason)
}

// replyAndClose writes an error response with "Connection: close", then
// half-closes c and discards what the client still sends for a moment, so that
// closing does not reset the connection before the client read the answer.
func (s *Server) replyAndClose(c net.Conn, status int, reason string) {
	body := "jazzmine proxy: " + reason + "\n"
	c.SetWriteDeadline(time.Now().Add(s.cfg.HeaderTimeout))
	_, err := fmt.Fprintf(c, "HTTP/1.1 %d %s\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s",
		status, http.StatusText(status), len(body), body)
	if err != nil {
		return
	}
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		cw.CloseWrite()
	}
	c.SetReadDeadline(time.Now().Add(lingerTime))
	buf := make([]byte, 4096)
	for n := 0; n < lingerBytes; {
		k, err := c.Read(buf)
		n += k
		if err != nil {
			return
		}
	}
}

// How long and how much replyAndClose reads after its answer.
const (
	lingerTime  = time.Second
	lingerBytes = 256 << 10
)

// sourceOf returns the source address of c, IPv4-mapped addresses unmapped.
func sourceOf(c net.Conn) netip.AddrPort {
	if a, ok := c.RemoteAddr().(*net.TCPAddr); ok {
		ap := a.AddrPort()
		return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
	}
	ap, _ := netip.ParseAddrPort(c.RemoteAddr().String())
	return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
}

// tracker holds the connections of one Serve call, so that it can close them
// all when it ends.
type tracker struct {
	mu     sync.Mutex // guards closed and conns
	closed bool
	conns  map[net.Conn]struct{}
}

// add tracks c; it returns false, leaving c to the caller to close, once the
// tracker is closed.
func (t *tracker) add(c net.Conn) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return false
	}
	t.conns[c] = struct{}{}
	return true
}

// remove stops tracking c.
func (t *tracker) remove(c net.Conn) {
	t.mu.Lock()
	delete(t.conns, c)
	t.mu.Unlock()
}

// closeAll closes every tracked connection and every one added later.
func (t *tracker) closeAll() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.closed = true
	for c := range t.conns {
		c.Close()
	}
	clear(t.conns)
}
