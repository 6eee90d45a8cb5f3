package proxy

import (
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"sync/atomic"
	"time"
)

// connect serves "CONNECT host:port": it checks the allowlist, dials, answers
// 200 and relays bytes both ways until both sides are done, one side fails,
// or the tunnel is idle for IdleTimeout.
func (s *session) connect(req *http.Request) {
	host, port, err := net.SplitHostPort(req.Host)
	if err != nil || port == "" {
		s.fail(quote(req.Host), &failure{status: http.StatusBadRequest, reason: "CONNECT needs host:port, got " + quote(req.Host)})
		return
	}
	t, err := parseTarget(host, port)
	if err != nil {
		s.fail(quote(req.Host), &failure{status: http.StatusBadRequest, reason: err.Error()})
		return
	}
	if !s.sb.allows(t) {
		s.refuse(t)
		return
	}
	up, addr, f := s.srv.dialTarget(s.ctx, t)
	if f != nil {
		s.fail(t.String(), f)
		return
	}
	if !s.tr.add(up) {
		up.Close()
		return
	}
	defer s.tr.remove(up)
	defer up.Close()

	start := time.Now()
	tun := &tunnel{idle: s.srv.cfg.IdleTimeout}
	tun.touch()
	s.conn.SetWriteDeadline(time.Now().Add(tun.idle))
	if _, err := io.WriteString(s.conn, "HTTP/1.1 200 Connection established\r\n\r\n"); err != nil {
		return
	}
	// Bytes the client sent right after its request (a TLS hello) are buffered.
	if n := s.br.Buffered(); n > 0 {
		b, _ := s.br.Peek(n)
		up.SetWriteDeadline(time.Now().Add(tun.idle))
		if _, err := up.Write(b); err != nil {
			return
		}
		tun.sent.Add(int64(n))
	}

	done := make(chan error, 1)
	go func() { done <- tun.relay(up, s.conn, &tun.sent) }()
	downErr := tun.relay(s.conn, up, &tun.received)
	upErr := <-done

	s.srv.log.Info("proxy: tunnel closed", "sandbox", s.sb.name, "target", t.String(),
		"addr", addr.String(), "bytes_sent", tun.sent.Load(), "bytes_received", tun.received.Load(),
		"duration", time.Since(start).Round(time.Millisecond).String(), "end", endOf(upErr, downErr))
}

// tunnel relays bytes between a client and a target. It is idle when no
// byte moved in either direction for idle.
type tunnel struct {
	idle     time.Duration
	last     atomic.Int64 // UnixNano of the last byte moved either way
	sent     atomic.Int64 // client to target
	received atomic.Int64 // target to client
}

func (t *tunnel) touch() { t.last.Store(time.Now().UnixNano()) }

// relay copies src to dst. At src's end of stream it half-closes dst, so the
// other direction may go on; on any other error, or when the tunnel is idle,
// it closes both, which ends the other direction too. It returns nil at end
// of stream.
func (t *tunnel) relay(dst, src net.Conn, count *atomic.Int64) error {
	buf := make([]byte, 32<<10)
	for {
		src.SetReadDeadline(time.Unix(0, t.last.Load()).Add(t.idle))
		n, err := src.Read(buf)
		if n > 0 {
			t.touch()
			dst.SetWriteDeadline(time.Now().Add(t.idle))
			if _, werr := dst.Write(buf[:n]); werr != nil {
				dst.Close()
				src.Close()
				return werr
			}
			count.Add(int64(n))
			t.touch()
		}
		if err == nil {
			continue
		}
		if errors.Is(err, os.ErrDeadlineExceeded) && time.Since(time.Unix(0, t.last.Load())) < t.idle {
			continue // the other direction moved a byte: not idle yet
		}
		if err == io.EOF {
			if cw, ok := dst.(interface{ CloseWrite() error }); ok && cw.CloseWrite() == nil {
				return nil
			}
		}
		dst.Close()
		src.Close()
		if err == io.EOF {
			return nil
		}
		return err
	}
}

// endOf says how a tunnel ended, for the log.
func endOf(errs ...error) string {
	for _, err := range errs {
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return "idle"
		}
	}
	for _, err := range errs {
		if err != nil && !errors.Is(err, net.ErrClosed) {
			return "error"
		}
	}
	return "closed"
}
