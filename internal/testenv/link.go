package testenv

import (
	"io"
	"net"
	"sync"
	"testing"
)

// Link is a TCP relay on loopback to a server, that a test can cut and restore: a
// network partition between one client and the server, with nothing else touched.
// (A few lines of io.Copy; no library brings a relay that can be cut on demand.)
type Link struct {
	ln     net.Listener
	target string

	mu    sync.Mutex // guards conns and cut
	conns map[net.Conn]bool
	cut   bool
	wg    sync.WaitGroup
}

// NewLink relays a listener on 127.0.0.1 to target until the test ends.
func NewLink(t testing.TB, target string) *Link {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := &Link{ln: ln, target: target, conns: map[net.Conn]bool{}}
	l.wg.Add(1)
	go l.accept()
	t.Cleanup(func() {
		ln.Close()
		l.Cut()
		l.wg.Wait()
	})
	return l
}

// Addr is the address clients dial instead of the server's.
func (l *Link) Addr() string { return l.ln.Addr().String() }

// Cut closes every relayed connection and refuses new ones until Restore.
func (l *Link) Cut() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.cut = true
	for c := range l.conns {
		c.Close()
	}
}

// Restore relays new connections again.
func (l *Link) Restore() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.cut = false
}

func (l *Link) accept() {
	defer l.wg.Done()
	for {
		in, err := l.ln.Accept()
		if err != nil {
			return
		}
		out, err := net.Dial("tcp", l.target)
		if err != nil {
			in.Close()
			continue
		}
		l.mu.Lock()
		if l.cut {
			l.mu.Unlock()
			in.Close()
			out.Close()
			continue
		}
		l.conns[in], l.conns[out] = true, true
		l.mu.Unlock()
		l.wg.Add(2)
		go l.pipe(in, out)
		go l.pipe(out, in)
	}
}

func (l *Link) pipe(dst, src net.Conn) {
	defer l.wg.Done()
	_, _ = io.Copy(dst, src)
	dst.Close()
	src.Close()
	l.mu.Lock()
	delete(l.conns, dst)
	delete(l.conns, src)
	l.mu.Unlock()
}
