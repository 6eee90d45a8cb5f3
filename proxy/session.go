package proxy

import (
	"bufio"
	"context"
	"errors"
	"io"
	"math"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"
)

// session serves the requests of one client connection of a known sandbox.
type session struct {
	srv  *Server
	ctx  context.Context // ends when Serve stops
	tr   *tracker
	conn net.Conn
	sb   *sandbox

	in *connReader       // conn, with a deadline per read while a body flows
	lr *io.LimitedReader // in, limited while a header is read
	br *bufio.Reader     // lr
}

// connReader reads from a connection; with idle set, every Read must make
// progress within idle.
type connReader struct {
	c    net.Conn
	idle time.Duration // 0: leave the deadline as it is
}

func (r *connReader) Read(p []byte) (int, error) {
	if r.idle > 0 {
		r.c.SetReadDeadline(time.Now().Add(r.idle))
	}
	return r.c.Read(p)
}

// idleConn is a connection whose every Read and Write must make progress
// within idle; each byte moved touches act.
type idleConn struct {
	net.Conn
	idle time.Duration
	act  *activity
}

func (c idleConn) Read(p []byte) (int, error) {
	c.SetReadDeadline(time.Now().Add(c.idle))
	n, err := c.Conn.Read(p)
	if n > 0 {
		c.act.touch()
	}
	return n, err
}

func (c idleConn) Write(p []byte) (int, error) {
	c.SetWriteDeadline(time.Now().Add(c.idle))
	n, err := c.Conn.Write(p)
	if n > 0 {
		c.act.touch()
	}
	return n, err
}

// serve reads and answers requests until the connection ends, is closed by a
// response, or Serve stops.
func (s *session) serve() {
	s.in = &connReader{c: s.conn}
	s.lr = &io.LimitedReader{R: s.in}
	s.br = bufio.NewReader(s.lr)
	for first := true; ; first = false {
		req, ok := s.readRequest(first)
		if !ok || !s.answer(req) {
			return
		}
	}
}

// readRequest reads the next request's header within HeaderTimeout and
// MaxHeaderBytes (a keep-alive connection first waits up to IdleTimeout for
// it to start). It answers a malformed or oversized header itself.
func (s *session) readRequest(first bool) (*http.Request, bool) {
	cfg := &s.srv.cfg
	s.in.idle = 0
	s.lr.N = math.MaxInt64
	if !first {
		s.conn.SetReadDeadline(time.Now().Add(cfg.IdleTimeout))
		if _, err := s.br.Peek(1); err != nil {
			return nil, false
		}
	}
	s.conn.SetReadDeadline(time.Now().Add(cfg.HeaderTimeout))
	s.lr.N = int64(cfg.MaxHeaderBytes) + 4096 // bufio reads a little ahead
	req, err := http.ReadRequest(s.br)
	if err != nil {
		switch {
		case s.lr.N <= 0:
			s.srv.replyAndClose(s.conn, http.StatusRequestHeaderFieldsTooLarge, "request header too large")
		case errors.Is(err, io.EOF), errors.Is(err, os.ErrDeadlineExceeded), errors.Is(err, net.ErrClosed):
			// The client went away, was too slow, or Serve stopped.
		default:
			s.srv.replyAndClose(s.conn, http.StatusBadRequest, "malformed request")
		}
		return nil, false
	}
	s.lr.N = math.MaxInt64
	s.conn.SetReadDeadline(time.Time{})
	s.in.idle = cfg.IdleTimeout
	return req, true
}

// answer serves one request; it reports whether the connection may carry
// another.
func (s *session) answer(req *http.Request) bool {
	switch {
	case req.Method == http.MethodConnect:
		s.connect(req)
		return false
	case req.URL.Scheme != "":
		return s.forward(req)
	default:
		s.fail(quote(req.RequestURI), &failure{status: http.StatusBadRequest,
			reason: "not a proxy request: use CONNECT host:port, or an absolute http:// URI"})
		return false
	}
}

// refuse answers 403 for a target the sandbox may not reach.
func (s *session) refuse(t target) {
	s.fail(t.String(), &failure{status: http.StatusForbidden,
		reason: t.String() + " is not allowed for sandbox " + s.sb.name})
}

// fail logs a failed request and answers it; the connection ends.
func (s *session) fail(target string, f *failure) {
	msg := "proxy: refused"
	if f.status >= 500 {
		msg = "proxy: target unreachable"
	}
	attrs := []any{"sandbox", s.sb.name, "target", target, "status", f.status, "reason", f.reason}
	if f.err != nil {
		attrs = append(attrs, "err", f.err.Error())
	}
	s.srv.log.Warn(msg, attrs...)
	s.srv.replyAndClose(s.conn, f.status, f.reason)
}

// quote quotes a client-supplied string for a response or a log line.
func quote(s string) string {
	if len(s) > 100 {
		s = s[:100] + "..."
	}
	return strconv.Quote(strings.ToValidUTF8(s, "?"))
}
