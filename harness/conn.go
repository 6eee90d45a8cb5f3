package harness

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sync"
)

// ErrClosed is returned by Conn operations after the stream has ended or Close was
// called.
var ErrClosed = errors.New("harness: connection closed")

// Conn is one harness's protocol stream: requests are written to w, events read from r
// as JSON lines. A reader goroutine started by NewConn reads lines ahead so that every
// operation can honour deadlines; it ends when r returns an error (close the stream to
// stop it) or Close is called.
//
// A Conn serves one operation at a time (WaitReady, Ping, Reset, or an Executor's Run);
// the pool's lease guarantees that. Every line must answer the operation under way:
// anything else is an [ErrProtocol], after which the container is not to be used.
type Conn struct {
	w   io.Writer
	wmu sync.Mutex // guards w

	// executeNonce is the nonce of the last execute, which its reset_done echoes.
	// Written by Executor.Run and read by AwaitReset, one operation at a time.
	executeNonce string

	lines   chan line
	stop    chan struct{}
	stopped sync.Once
	done    chan struct{} // closed when the reader goroutine has returned
	err     error         // why the reader ended; read only after done is closed
}

type line struct {
	b        []byte // the line without its newline; nil when oversize
	n        int64  // bytes read for it, newline included
	oversize bool
}

// NewConn starts reading r. maxLine caps one line (zero means DefaultMaxLineBytes); a
// longer line is consumed, dropped and reported to the running execution as an output
// limit breach.
func NewConn(r io.Reader, w io.Writer, maxLine int) *Conn {
	if maxLine <= 0 {
		maxLine = DefaultMaxLineBytes
	}
	c := &Conn{
		w:     w,
		lines: make(chan line, 64),
		stop:  make(chan struct{}),
		done:  make(chan struct{}),
	}
	go c.read(r, maxLine)
	return c
}

func (c *Conn) read(r io.Reader, maxLine int) {
	defer close(c.done)
	br := bufio.NewReaderSize(r, 64<<10)
	var buf []byte
	for {
		frag, err := br.ReadSlice('\n')
		var l line
		complete := false
		switch {
		case err == nil:
			complete = true
		case errors.Is(err, bufio.ErrBufferFull):
		default:
			if len(frag) > 0 || len(buf) > 0 {
				// A last line without a newline is still a line.
				l.n = int64(len(buf) + len(frag))
				if len(buf)+len(frag) <= maxLine {
					l.b = append(append([]byte(nil), buf...), frag...)
				} else {
					l.oversize = true
				}
				c.send(l)
			}
			if errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
			c.err = err
			return
		}
		if len(buf)+len(frag) > maxLine {
			// Drop the rest of an oversized line without holding it in memory.
			n := int64(len(buf) + len(frag))
			buf = buf[:0]
			for !complete {
				frag, err = br.ReadSlice('\n')
				n += int64(len(frag))
				if err == nil {
					complete = true
				} else if !errors.Is(err, bufio.ErrBufferFull) {
					c.err = err
					c.send(line{n: n, oversize: true})
					return
				}
			}
			if !c.send(line{n: n, oversize: true}) {
				return
			}
			continue
		}
		buf = append(buf, frag...)
		if !complete {
			continue
		}
		l.n = int64(len(buf))
		l.b = bytes.Clone(bytes.TrimSuffix(buf, []byte{'\n'}))
		buf = buf[:0]
		if !c.send(l) {
			return
		}
	}
}

func (c *Conn) send(l line) bool {
	select {
	case c.lines <- l:
		return true
	case <-c.stop:
		return false
	}
}

// Close stops the reader goroutine from delivering further lines. It does not close the
// underlying stream: the owner of the stream closes it, which ends a read in progress.
// Close is safe to call more than once.
func (c *Conn) Close() error {
	c.stopped.Do(func() { close(c.stop) })
	return nil
}

// Done is closed when the reader goroutine has returned.
func (c *Conn) Done() <-chan struct{} { return c.done }

// write sends one request line.
func (c *Conn) write(req request) error {
	return c.writeLine(req.Type, req)
}

// writeLine sends v, a request line of type typ, encoded as JSON.
func (c *Conn) writeLine(typ string, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("encode %s request: %w", typ, err)
	}
	return c.writeRaw(typ, append(b, '\n'))
}

// writeRaw sends b, a request line of type typ with its newline.
func (c *Conn) writeRaw(typ string, b []byte) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if _, err := c.w.Write(b); err != nil {
		return fmt.Errorf("write %s request: %w", typ, err)
	}
	return nil
}

// next returns the next line, or an error when ctx ends or the stream has ended.
func (c *Conn) next(ctx context.Context) (line, error) {
	select {
	case l := <-c.lines:
		return l, nil
	default:
	}
	select {
	case l := <-c.lines:
		return l, nil
	case <-c.done:
		// The reader may have queued lines before it returned.
		select {
		case l := <-c.lines:
			return l, nil
		default:
		}
		return line{}, fmt.Errorf("%w: %v", ErrClosed, c.err)
	case <-c.stop:
		return line{}, ErrClosed
	case <-ctx.Done():
		return line{}, ctx.Err()
	}
}

// ErrProtocol wraps every line that breaks the protocol: not JSON, an event nobody
// asked for, an answer without the nonce of the request it claims to answer. The
// harness is the only writer of the stream, so such a line means it is broken or that
// something else reached the stream: the container must not be used again.
var ErrProtocol = errors.New("harness: protocol violation")

// newNonce returns a fresh request nonce: 128 random bits, hex.
func newNonce() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// expect reads the next line and returns it if it is an event of type want carrying
// nonce (none for ready); any other line is an ErrProtocol.
func (c *Conn) expect(ctx context.Context, want, nonce string) (json.RawMessage, error) {
	l, err := c.next(ctx)
	if err != nil {
		return nil, err
	}
	if l.oversize {
		return nil, fmt.Errorf("%w: a line of %d bytes while waiting for %s", ErrProtocol, l.n, want)
	}
	var head struct {
		Type  string `json:"type"`
		Nonce string `json:"nonce"`
	}
	if err := json.Unmarshal(l.b, &head); err != nil {
		return nil, fmt.Errorf("%w: a line that is not JSON while waiting for %s: %q", ErrProtocol, want, truncate(l.b, 120))
	}
	if head.Type != want || head.Nonce != nonce {
		return nil, fmt.Errorf("%w: %s with nonce %q while waiting for %s with nonce %q", ErrProtocol, head.Type, head.Nonce, want, nonce)
	}
	return l.b, nil
}

// Quiet reports whether no line is waiting to be read and the stream is open: what
// the pool checks before it lends an idle container, to which nothing may have
// written since its last answer.
func (c *Conn) Quiet() bool {
	select {
	case <-c.done:
		return false
	default:
	}
	return len(c.lines) == 0
}

// WaitReady waits for the harness's ready event, which must be its first line.
func (c *Conn) WaitReady(ctx context.Context) (Ready, error) {
	b, err := c.expect(ctx, EventReady, "")
	if err != nil {
		return Ready{}, fmt.Errorf("wait for harness ready: %w", err)
	}
	var r Ready
	if err := json.Unmarshal(b, &r); err != nil {
		return Ready{}, fmt.Errorf("decode harness ready: %w", err)
	}
	return r, nil
}

// Ping checks that the harness answers: its next line must be the pong of this ping.
func (c *Conn) Ping(ctx context.Context) error {
	nonce := newNonce()
	if err := c.write(request{Type: requestPing, Nonce: nonce}); err != nil {
		return err
	}
	if _, err := c.expect(ctx, EventPong, nonce); err != nil {
		return fmt.Errorf("wait for harness pong: %w", err)
	}
	return nil
}

// Reset asks the harness to kill what earlier executions left and wipe the workspace
// and temporary directory, and waits for the reset_done of this request. The harness
// does the same on its own after every execute; see [Conn.AwaitReset].
func (c *Conn) Reset(ctx context.Context) error {
	nonce := newNonce()
	if err := c.write(request{Type: requestReset, Nonce: nonce}); err != nil {
		return err
	}
	if _, err := c.expect(ctx, EventResetDone, nonce); err != nil {
		return fmt.Errorf("wait for harness reset_done: %w", err)
	}
	return nil
}

// AwaitReset waits for the reset_done with which the harness ends every execute, after
// the script_done: by then it has killed what the execution left, wiped the workspace
// and temporary directory, and warmed up the next child, as for a [Conn.Reset]. It
// must be the next line and carry the nonce of the last execute. Call it once after
// each [Executor.Run] that ended with a script_done.
func (c *Conn) AwaitReset(ctx context.Context) error {
	if _, err := c.expect(ctx, EventResetDone, c.executeNonce); err != nil {
		return fmt.Errorf("wait for harness reset_done: %w", err)
	}
	return nil
}
