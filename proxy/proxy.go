package proxy

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// Server is the egress proxy. Create it with New; it is safe for concurrent
// use, and Serve may run on several listeners at once (a sandbox's cap is
// shared by all the listeners Serve runs for it).
type Server struct {
	cfg           Config // defaults applied
	sandboxes     []*sandbox
	allowLoopback bool
	log           *slog.Logger
	// perSandbox caps each sandbox's connections: its equal share of MaxConns,
	// at most MaxConnsPerSandbox.
	perSandbox int

	mu sync.Mutex // guards every sandbox's active

	rejecting atomic.Int64 // connections being answered 403/503 outside the caps
}

// New validates cfg and returns a Server. Config errors wrap ErrInvalidConfig.
func New(cfg Config) (*Server, error) {
	cfg = cfg.withDefaults()
	sandboxes, err := compile(cfg)
	if err != nil {
		return nil, err
	}
	return &Server{
		cfg:           cfg,
		sandboxes:     sandboxes,
		allowLoopback: cfg.allowLoopback,
		log:           cfg.Logger,
		perSandbox:    min(cfg.MaxConnsPerSandbox, cfg.MaxConns/len(sandboxes)),
	}, nil
}

// ListenAndServe listens on the Socket of every sandbox and serves each
// socket's connections as that sandbox's (see Serve) until ctx ends, then
// returns nil once every connection is closed; if one listener fails, it stops
// them all and returns why. Each socket is made connectable by every user
// (mode 0666): who may connect is decided by who can see the socket, that is,
// which containers mount its directory. A socket left at the path by a proxy
// that died is replaced; anything else there (a file, a socket that still
// answers) is an error, returned before anything is served, as is a sandbox
// without a Socket. The sockets are removed when it returns.
func (s *Server) ListenAndServe(ctx context.Context) error {
	lns := make([]net.Listener, 0, len(s.sandboxes))
	for _, sb := range s.sandboxes {
		ln, err := listenUnix(ctx, sb)
		if err != nil {
			for _, ln := range lns {
				ln.Close()
			}
			return err
		}
		lns = append(lns, ln)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errs := make([]error, len(lns))
	var wg sync.WaitGroup
	for i, sb := range s.sandboxes {
		wg.Go(func() {
			errs[i] = s.serve(ctx, sb, lns[i])
			cancel() // one listener gone ends them all
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// listenUnix listens on the sandbox's socket, replacing a stale one.
func listenUnix(ctx context.Context, sb *sandbox) (net.Listener, error) {
	if sb.socket == "" {
		return nil, fmt.Errorf("proxy: sandbox %q has no socket to listen on", sb.name)
	}
	if fi, err := os.Lstat(sb.socket); err == nil {
		if fi.Mode().Type() != fs.ModeSocket {
			return nil, fmt.Errorf("proxy: %s (the socket of sandbox %q) exists and is not a socket", sb.socket, sb.name)
		}
		c, err := net.DialTimeout("unix", sb.socket, time.Second)
		if err == nil {
			c.Close()
			return nil, fmt.Errorf("proxy: %s (the socket of sandbox %q) is in use by another process", sb.socket, sb.name)
		}
		if !errors.Is(err, syscall.ECONNREFUSED) {
			return nil, fmt.Errorf("proxy: %s (the socket of sandbox %q) is neither free nor stale: %w", sb.socket, sb.name, err)
		}
		if err := os.Remove(sb.socket); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("proxy: remove the stale socket %s of sandbox %q: %w", sb.socket, sb.name, err)
		}
	}
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "unix", sb.socket)
	if err != nil {
		return nil, fmt.Errorf("proxy: listen on %s for sandbox %q: %w", sb.socket, sb.name, err)
	}
	if err := os.Chmod(sb.socket, 0o666); err != nil {
		ln.Close()
		return nil, fmt.Errorf("proxy: make %s connectable for sandbox %q: %w", sb.socket, sb.name, err)
	}
	return ln, nil
}

// Serve accepts connections on ln and serves each as sandbox name's: the
// listener is the sandbox's identity, so ln must be one that only the
// sandbox's containers can reach. It serves until ctx ends. Then it closes ln
// and every connection it serves (client and upstream) at once, without
// waiting for requests under way, waits for all its goroutines, and returns
// nil. Serve owns ln and closes it on every return, also when the sandbox is
// not in the config (an error). If ln is closed by someone else, Serve ends
// the same way and returns that error; other accept errors (out of file
// descriptors) are logged and retried after a pause.
func (s *Server) Serve(ctx context.Context, name string, ln net.Listener) error {
	var sb *sandbox
	for _, x := range s.sandboxes {
		if x.name == name {
			sb = x
		}
	}
	if sb == nil {
		ln.Close()
		return fmt.Errorf("proxy: serve: sandbox %q is not in the config", name)
	}
	return s.serve(ctx, sb, ln)
}

// serve is Serve for a sandbox of the config.
func (s *Server) serve(ctx context.Context, sb *sandbox, ln net.Listener) error {
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

	s.log.Info("proxy: listening", "sandbox", sb.name, "addr", ln.Addr().String(), "allowed", len(sb.allowed)+len(sb.suffixes),
		"private_ranges", len(sb.private), "max_conns", s.perSandbox)

	var backoff time.Duration
	for {
		c, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			if errors.Is(err, net.ErrClosed) {
				return fmt.Errorf("proxy: accept for sandbox %q: %w", sb.name, err)
			}
			// Out of file descriptors and the like: wait and retry.
			backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
			s.log.Error("proxy: accept", "sandbox", sb.name, "err", err, "retry_in", backoff)
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
			s.handle(ctx, tr, c, sb)
		})
	}
}

// handle serves a new connection of sb within its connection cap.
func (s *Server) handle(ctx context.Context, tr *tracker, c net.Conn, sb *sandbox) {
	if why := s.acquire(sb); why != "" {
		s.log.Warn("proxy: refused a connection over the cap", "sandbox", sb.name, "reason", why)
		s.reject(c, http.StatusServiceUnavailable, why)
		return
	}
	defer s.release(sb)
	(&session{srv: s, ctx: ctx, tr: tr, conn: c, sb: sb}).serve()
}

// acquire counts a connection of sb against its cap; it returns why the
// connection is over the cap, or "" once it is counted. The caps of all
// sandboxes add up to at most MaxConns, so no sandbox waits on another's.
func (s *Server) acquire(sb *sandbox) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if sb.active >= s.perSandbox {
		return fmt.Sprintf("too many connections from sandbox %q (%d)", sb.name, s.perSandbox)
	}
	sb.active++
	return ""
}

// release uncounts a connection that acquire counted.
func (s *Server) release(sb *sandbox) {
	s.mu.Lock()
	sb.active--
	s.mu.Unlock()
}

// reject answers a connection that is not served (over a cap)
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
