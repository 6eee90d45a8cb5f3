package proxy

import (
	"bufio"
	"errors"
	"io"
	"net/http"
	"net/textproto"
	"os"
	"strings"
	"time"
)

// forward serves a plain HTTP request in absolute form ("GET
// http://host:port/path"; the port defaults to 80). It checks the allowlist,
// sends the request without its hop-by-hop and Proxy-* headers over a new
// connection to the target (one request per connection), and relays the
// response. It reports whether the client connection may carry another
// request.
func (s *session) forward(req *http.Request) bool {
	if !strings.EqualFold(req.URL.Scheme, "http") {
		s.fail(quote(req.RequestURI), &failure{status: http.StatusBadRequest,
			reason: "only http:// URIs are forwarded; use CONNECT for " + quote(req.URL.Scheme)})
		return false
	}
	port := req.URL.Port()
	if port == "" {
		port = "80"
	}
	t, err := parseTarget(req.URL.Hostname(), port)
	if err != nil {
		s.fail(quote(req.URL.Host), &failure{status: http.StatusBadRequest, reason: err.Error()})
		return false
	}
	if !s.sb.allows(t) {
		s.refuse(t)
		return false
	}
	up, addr, f := s.srv.dialTarget(s.ctx, t)
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
	client := idleConn{Conn: s.conn, idle: idle}
	upstream := idleConn{Conn: up, idle: idle}

	// The request as the target sees it.
	clientClose := req.Close || !req.ProtoAtLeast(1, 1)
	continueFirst := strings.EqualFold(req.Header.Get("Expect"), "100-continue")
	if continueFirst {
		req.Header.Del("Expect")
	}
	removeHopHeaders(req.Header)
	if _, ok := req.Header["User-Agent"]; !ok {
		req.Header["User-Agent"] = []string{""} // or Request.Write adds Go's
	}
	req.Host = req.URL.Host
	req.Close = true
	if continueFirst && req.ProtoAtLeast(1, 1) {
		if _, err := io.WriteString(client, "HTTP/1.1 100 Continue\r\n\r\n"); err != nil {
			return false
		}
	}
	if err := req.Write(upstream); err != nil {
		s.fail(t.String(), &failure{status: http.StatusBadGateway, reason: "sending the request to " + t.String() + " failed", err: err})
		return false
	}

	br := bufio.NewReader(upstream)
	var resp *http.Response
	for {
		resp, err = http.ReadResponse(br, req)
		if err != nil {
			f := &failure{status: http.StatusBadGateway, reason: "no valid response from " + t.String(), err: err}
			if errors.Is(err, os.ErrDeadlineExceeded) {
				f.status = http.StatusGatewayTimeout
			}
			s.fail(t.String(), f)
			return false
		}
		if resp.StatusCode == http.StatusSwitchingProtocols {
			resp.Body.Close()
			s.fail(t.String(), &failure{status: http.StatusBadGateway, reason: t.String() + " switched protocols, which the proxy does not relay"})
			return false
		}
		if resp.StatusCode >= 200 {
			break
		}
		resp.Body.Close() // an interim response (100 Continue, 103 Early Hints)
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
	err = resp.Write(client)

	s.srv.log.Info("proxy: forwarded", "sandbox", s.sb.name, "target", t.String(),
		"addr", addr.String(), "method", req.Method, "status", resp.StatusCode,
		"duration", time.Since(start).Round(time.Millisecond).String(), "complete", err == nil)
	return err == nil && keep
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
