package proxy

import (
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// connect serves "CONNECT host:port": it checks the allowlist, dials, answers
// 200 and relays bytes both ways until both sides are done, one side fails,
// the tunnel is idle for IdleTimeout, or, once the client has ended its side,
// for CloseGrace.
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
	up, addr, f := s.srv.dialTarget(s.ctx, s.sb, t)
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
	stop := make(chan struct{})
	var wg sync.WaitGroup
	go func() {
		err := tun.relay(up, s.conn, &tun.sent)
		if err == nil { // the client's end of stream, passed on as a half-close
			wg.Go(func() { tun.closeWhenQuiet(s.srv.cfg.CloseGrace, stop, up, s.conn) })
		}
		done <- err
	}()
	downErr := tun.relay(s.conn, up, &tun.received)
	upErr := <-done
	close(stop)
	wg.Wait()

	end := endOf(upErr, downErr)
	if tun.quiet.Load() {
		end = "client ended"
	}
	s.srv.log.Info("proxy: tunnel closed", "sandbox", s.sb.name, "target", t.String(),
		"addr", addr.String(), "bytes_sent", tun.sent.Load(), "bytes_received", tun.received.Load(),
		"duration", time.Since(start).Round(time.Millisecond).String(), "end", end)
}

// tunnel relays bytes between a client and a target. It is idle when no
// byte moved in either direction for idle.
type tunnel struct {
	activity
	idle     time.Duration
	sent     atomic.Int64 // client to target
	received atomic.Int64 // target to client
}

// activity is when a byte last moved through a tunnel or a forwarded
// exchange, either way.
type activity struct {
	last  atomic.Int64 // UnixNano of the last byte moved either way
	quiet atomic.Bool  // closeWhenQuiet closed the connections
}

func (a *activity) touch() { a.last.Store(time.Now().UnixNano()) }

// closeWhenQuiet is called at the client's end of stream: it closes conns (the
// client's and the target's) once no byte has moved for grace, counted from
// now at the earliest, so that a client gone frees its connection within
// grace however long the target stays silent. It returns when it closed them
// or when stop is closed.
func (a *activity) closeWhenQuiet(grace time.Duration, stop <-chan struct{}, conns ...net.Conn) {
	a.touch()
	timer := time.NewTimer(grace)
	defer timer.Stop()
	for {
		select {
		case <-stop:
			return
		case <-timer.C:
		}
		if left := grace - time.Since(time.Unix(0, a.last.Load())); left > 0 {
			timer.Reset(left)
			continue
		}
		a.quiet.Store(true)
		for _, c := range conns {
			c.Close()
		}
		return
	}
}

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
