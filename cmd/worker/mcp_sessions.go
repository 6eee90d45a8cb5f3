package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/jazzmine/worker/client"
	"github.com/jazzmine/worker/wire"
)

// conversations holds the fleet sessions each MCP conversation (an MCP session: the
// stdio connection, or one Mcp-Session-Id over HTTP) opened: at most one per sandbox,
// usable by that conversation alone, and closed when it ends.
type conversations struct {
	c   *client.Client
	log *slog.Logger

	mu     sync.Mutex // guards byConv and closed
	byConv map[*mcp.ServerSession]*conversation
	closed bool
	ends   sync.WaitGroup // the goroutines that wait for a conversation's end
}

// conversation is one conversation's sessions, and the files it was named.
type conversation struct {
	mu        sync.Mutex                 // guards sessions and files, and is held while a session opens
	sessions  map[string]*client.Session // by sandbox
	ended     map[string]string          // by sandbox: why its last session ended, said by the next call (see session)
	files     map[string]client.Artifact // by object: what resources/read may read (see readable)
	closed    bool                       // the conversation has ended
	mcpClosed func() error               // closes the MCP session
}

func newConversations(c *client.Client, log *slog.Logger) *conversations {
	return &conversations{c: c, log: log, byConv: map[*mcp.ServerSession]*conversation{}}
}

// conv returns the conversation of ss, which it starts watching for its end.
func (cs *conversations) conv(ss *mcp.ServerSession) (*conversation, error) {
	if ss == nil {
		return nil, errors.New("sessions need a conversation: this request has no MCP session")
	}
	cs.mu.Lock()
	defer cs.mu.Unlock()
	if cs.closed {
		return nil, errors.New("the MCP server is shutting down")
	}
	cv := cs.byConv[ss]
	if cv == nil {
		cv = &conversation{sessions: map[string]*client.Session{}, ended: map[string]string{}, files: map[string]client.Artifact{}, mcpClosed: ss.Close}
		cs.byConv[ss] = cv
		cs.ends.Add(1)
		go func() {
			defer cs.ends.Done()
			_ = ss.Wait()
			cs.end(ss)
		}()
	}
	return cv, nil
}

// open returns the conversation's session of sandbox, opening it on the fleet (its
// first call, which claims a container) if it has none.
func (cs *conversations) open(ctx context.Context, ss *mcp.ServerSession, sandbox string) (*client.Session, error) {
	cv, err := cs.conv(ss)
	if err != nil {
		return nil, err
	}
	cv.mu.Lock()
	defer cv.mu.Unlock()
	if cv.closed {
		return nil, errors.New("the conversation has ended")
	}
	if sess := cv.sessions[sandbox]; sess != nil {
		return sess, nil
	}
	sess := cs.c.NewSession(sandbox)
	res, err := sess.Run(ctx, wire.Job{Mode: wire.ModeInteractive, Script: "pass"})
	if err != nil {
		return nil, fmt.Errorf("open a session of sandbox %q: %w", sandbox, err)
	}
	if !res.Success {
		return nil, fmt.Errorf("open a session of sandbox %q: %s: %s", sandbox, res.ErrorKind, res.Error)
	}
	cv.sessions[sandbox] = sess
	return sess, nil
}

// session returns the conversation's session of sandbox, a new one (opened by its
// first call) if it has none: where run_python runs by default. A new one that
// replaces a session that ended comes with a note saying so.
func (cs *conversations) session(ss *mcp.ServerSession, sandbox string) (*client.Session, string, error) {
	cv, err := cs.conv(ss)
	if err != nil {
		return nil, "", err
	}
	cv.mu.Lock()
	defer cv.mu.Unlock()
	if cv.closed {
		return nil, "", errors.New("the conversation has ended")
	}
	sess, note := cv.sessions[sandbox], ""
	if sess == nil {
		sess = cs.c.NewSession(sandbox)
		cv.sessions[sandbox] = sess
		if why := cv.ended[sandbox]; why != "" {
			note = "this call ran in a new session: the previous one ended (" + why + "), and with it the variables, imports and files of earlier calls"
			delete(cv.ended, sandbox)
		}
	}
	return sess, note, nil
}

// maxReadable bounds the files a conversation may read back; past it, one is
// forgotten for each new one (they expire with the files bucket anyway, in an hour).
const maxReadable = 1024

// readable lets the conversation of ss read a's object as a resource (a file too
// large to include, the whole of a cut output): it may read what it was named, and
// nothing else of the bucket.
func (cs *conversations) readable(ss *mcp.ServerSession, a *client.Artifact) {
	cv, err := cs.conv(ss)
	if err != nil {
		return
	}
	cv.mu.Lock()
	defer cv.mu.Unlock()
	if len(cv.files) >= maxReadable {
		for k := range cv.files { // any one: a map keeps no order, and every entry expires
			delete(cv.files, k)
			break
		}
	}
	cv.files[a.Object] = *a
}

// file returns the file of object, if the conversation of ss was named it.
func (cs *conversations) file(ss *mcp.ServerSession, object string) (client.Artifact, bool) {
	cs.mu.Lock()
	cv := cs.byConv[ss]
	cs.mu.Unlock()
	if cv == nil {
		return client.Artifact{}, false
	}
	cv.mu.Lock()
	defer cv.mu.Unlock()
	a, ok := cv.files[object]
	return a, ok
}

// lookup returns the session of the conversation with the id.
func (cs *conversations) lookup(ss *mcp.ServerSession, id string) (*client.Session, error) {
	cs.mu.Lock()
	cv := cs.byConv[ss]
	cs.mu.Unlock()
	if cv != nil {
		cv.mu.Lock()
		defer cv.mu.Unlock()
		for _, sess := range cv.sessions {
			if sess.ID == id {
				return sess, nil
			}
		}
	}
	return nil, fmt.Errorf("session %q is not open in this conversation: open_session opens one", id)
}

// close closes the session of the conversation with the id.
func (cs *conversations) close(ctx context.Context, ss *mcp.ServerSession, id string) (*client.Session, error) {
	sess, err := cs.lookup(ss, id)
	if err != nil {
		return nil, err
	}
	cs.forget(ss, sess, "")
	return sess, sess.Close(ctx)
}

// forget takes a session out of its conversation: closed, or lost on the fleet (why,
// which the next call of its sandbox says; empty for a session closed on purpose).
func (cs *conversations) forget(ss *mcp.ServerSession, sess *client.Session, why string) {
	cs.mu.Lock()
	cv := cs.byConv[ss]
	cs.mu.Unlock()
	if cv == nil {
		return
	}
	cv.mu.Lock()
	defer cv.mu.Unlock()
	if cv.sessions[sess.Sandbox] == sess {
		delete(cv.sessions, sess.Sandbox)
		if why != "" {
			cv.ended[sess.Sandbox] = why
		}
	}
}

// end closes the sessions of a conversation that ended.
func (cs *conversations) end(ss *mcp.ServerSession) {
	cs.mu.Lock()
	cv := cs.byConv[ss]
	delete(cs.byConv, ss)
	cs.mu.Unlock()
	if cv == nil {
		return
	}
	cv.mu.Lock() // after an open under way
	cv.closed = true
	sessions := cv.sessions
	cv.sessions = nil
	cv.mu.Unlock()
	for _, sess := range sessions {
		ctx, cancel := context.WithTimeout(context.Background(), mcpShutdown)
		if err := sess.Close(ctx); err != nil {
			cs.log.Warn("close the session of an MCP conversation that ended", "session_id", sess.ID, "err", err)
		}
		cancel()
	}
}

// closeAll ends every conversation, which closes their sessions, and waits for it.
// It is idempotent.
func (cs *conversations) closeAll() {
	cs.mu.Lock()
	cs.closed = true
	var closers []func() error
	for _, cv := range cs.byConv {
		closers = append(closers, cv.mcpClosed)
	}
	cs.mu.Unlock()
	for _, close := range closers {
		_ = close()
	}
	cs.ends.Wait()
}
