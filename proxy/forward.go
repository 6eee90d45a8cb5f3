package proxy

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/http"
	"net/textproto"
	"os"
	"strings"
	"sync"
	"time"
)

// forward serves a plain HTTP request in absolute form ("GET
// http://host:port/path"; the port defaults to 80). It checks the allowlist,
// sends the request without its hop-by-hop and Proxy-* headers over a new
// connection to the target (one request per connection), and relays the
// response. Once the request is sent, a client that ends its side frees the
// exchange within CloseGrace (see watchClient). It reports whether the
// client connection may carry another request.
func (s *session) forward(req *http.Request) bool {
	t, ok := s.forwardTarget(req)
	if !ok {
		return false
	}
	up, addr, f := s.srv.dialTarget(s.ctx, s.sb, t)
	if f != nil {
		s.fail(t.String(), f)
		return false
	}
	if !s.tr.add(up) {
		up.Close()
		return false
	}
	defer s.tr.remove(up)
	defer up.Close()
	start := time.Now()
	idle := s.srv.cfg.IdleTimeout
	act := &activity{}
	client := idleConn{Conn: s.conn, idle: idle, act: act}
	upstream := idleConn{Conn: up, idle: idle, act: act}

	clientClose, continueFirst := prepareRequest(req)
	if continueFirst && req.ProtoAtLeast(1, 1) {
		if _, err := io.WriteString(client, "HTTP/1.1 100 Continue\r\n\r\n"); err != nil {
			return false
		}
	}
	if err := req.Write(upstream); err != nil {
		s.fail(t.String(), &failure{status: http.StatusBadGateway, reason: "sending the request to " + t.String() + " failed", err: err})
		return false
	}

	stopWatch := s.watchClient(act, up)
	defer stopWatch()

	logged := func(attrs ...any) {
		attrs = append([]any{"sandbox", s.sb.name, "target", t.String(), "addr", addr.String(), "method", req.Method}, attrs...)
		if act.quiet.Load() {
			attrs = append(attrs, "end", "client ended")
		}
		s.srv.log.Info("proxy: forwarded", attrs...)
	}
	resp, f := readFinal(bufio.NewReader(upstream), req, t)
	if f != nil {
		if f.err != nil && act.quiet.Load() { // the read failed because the client went
			logged("duration", time.Since(start).Round(time.Millisecond).String(), "complete", false)
		} else {
			stopWatch() // the session's reader is fail's again
			s.fail(t.String(), f)
		}
		return false
	}
	defer resp.Body.Close()

	// The response as the client sees it, framed for the client's HTTP version.
	removeHopHeaders(resp.Header)
	resp.Proto, resp.ProtoMajor, resp.ProtoMinor = "HTTP/1.1", 1, 1
	chunked := len(resp.TransferEncoding) > 0 && resp.TransferEncoding[0] == "chunked"
	keep := !clientClose && (resp.ContentLength >= 0 || chunked)
	if !req.ProtoAtLeast(1, 1) {
		resp.TransferEncoding = nil // an HTTP/1.0 client reads the body until close
	}
	resp.Close = !keep
	err := resp.Write(client)

	logged("status", resp.StatusCode, "duration", time.Since(start).Round(time.Millisecond).String(), "complete", err == nil)
	return err == nil && keep
}

// forwardTarget checks that req is a plain http:// request and returns its target,
// if the sandbox may reach it; else it answers the client and returns false.
func (s *session) forwardTarget(req *http.Request) (target, bool) {
	if !strings.EqualFold(req.URL.Scheme, "http") {
		s.fail(quote(req.RequestURI), &failure{status: http.StatusBadRequest,
			reason: "only http:// URIs are forwarded; use CONNECT for " + quote(req.URL.Scheme)})
		return target{}, false
	}
	port := req.URL.Port()
	if port == "" {
		port = "80"
	}
	t, err := parseTarget(req.URL.Hostname(), port)
	if err != nil {
		s.fail(quote(req.URL.Host), &failure{status: http.StatusBadRequest, reason: err.Error()})
		return target{}, false
	}
	if !s.sb.allows(t) {
		s.refuse(t)
		return target{}, false
	}
	return t, true
}

// prepareRequest makes req what the target sees (hop-by-hop headers gone, one
// request per connection, no Expect) and says whether the client asked to close
// and whether it waits for a 100 Continue.
func prepareRequest(req *http.Request) (clientClose, continueFirst bool) {
	clientClose = req.Close || !req.ProtoAtLeast(1, 1)
	continueFirst = strings.EqualFold(req.Header.Get("Expect"), "100-continue")
	if continueFirst {
		req.Header.Del("Expect")
	}
	removeHopHeaders(req.Header)
	if _, ok := req.Header["User-Agent"]; !ok {
		req.Header["User-Agent"] = []string{""} // or Request.Write adds Go's
	}
	req.Host = req.URL.Host
	req.Close = true
	return clientClose, continueFirst
}

// readFinal reads the target's final response to req, skipping interim ones; it
// returns why there is none (no valid response, or a protocol switch).
func readFinal(br *bufio.Reader, req *http.Request, t target) (*http.Response, *failure) {
	for {
		resp, err := http.ReadResponse(br, req)
		if err != nil {
			f := &failure{status: http.StatusBadGateway, reason: "no valid response from " + t.String(), err: err}
			if errors.Is(err, os.ErrDeadlineExceeded) {
				f.status = http.StatusGatewayTimeout
			}
			return nil, f
		}
		if resp.StatusCode == http.StatusSwitchingProtocols {
			resp.Body.Close()
			return nil, &failure{status: http.StatusBadGateway, reason: t.String() + " switched protocols, which the proxy does not relay"}
		}
		if resp.StatusCode >= 200 {
			return resp, nil
		}
		resp.Body.Close() // an interim response (100 Continue, 103 Early Hints)
	}
}

// watchClient watches the client, while the target answers a request it
// sent, for the client's end of stream, and then closes the client and up once
// no byte has moved for CloseGrace (activity.closeWhenQuiet). It reads
// nothing away: bytes the client sends meanwhile (a pipelined request) stay
// buffered for the next request. A client that pipelines more than the
// buffer holds is watched no further. The returned func stops the watch and
// waits for it, the session's reader being the caller's again then; it may be
// called twice.
func (s *session) watchClient(act *activity, up net.Conn) (stop func()) {
	s.in.idle = 0 // the deadline is the watch's; readRequest sets it again
	s.conn.SetReadDeadline(time.Time{})
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			_, err := s.br.Peek(s.br.Buffered() + 1)
			if err == nil {
				continue // a byte more of the next request
			}
			if errors.Is(err, io.EOF) {
				act.closeWhenQuiet(s.srv.cfg.CloseGrace, done, up, s.conn)
			}
			return // stopped, gone, or the buffer is full
		}
	})
	return sync.OnceFunc(func() {
		close(done)
		s.conn.SetReadDeadline(time.Unix(1, 0)) // wakes a Peek under way
		wg.Wait()
	})
}

// hopHeaders are the headers of one connection, never forwarded (RFC 9110
// section 7.6.1), besides those the Connection header names and every Proxy-*.
var hopHeaders = []string{
	"Connection", "Keep-Alive", "Proxy-Connection", "Te", "Trailer", "Transfer-Encoding", "Upgrade",
}

// removeHopHeaders deletes the hop-by-hop headers and every Proxy-* header
// (Proxy-Authorization, Proxy-Authenticate...) from h.
func removeHopHeaders(h http.Header) {
	for _, v := range h.Values("Connection") {
		for name := range strings.SplitSeq(v, ",") {
			if name = textproto.TrimString(name); name != "" {
				h.Del(name)
			}
		}
	}
	for _, name := range hopHeaders {
		h.Del(name)
	}
	for name := range h {
		if strings.HasPrefix(textproto.CanonicalMIMEHeaderKey(name), "Proxy-") {
			delete(h, name)
		}
	}
}
