package main

import (
	"context"
	"crypto/subtle"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/nats-io/nats.go"

	"github.com/jazzmine/worker/client"
	"github.com/jazzmine/worker/wire"
)

// The MCP server's defaults.
const (
	// defaultMCPTimeout is the timeout of a run_python call that sets none, and the
	// most one may ask for: the workers' default.
	defaultMCPTimeout = 30 * time.Second
	// mcpPath is where --http serves the streamable HTTP transport.
	mcpPath = "/mcp"
	// mcpShutdown bounds the HTTP server's shutdown and the closing of the sessions
	// the conversations opened.
	mcpShutdown = 30 * time.Second
	// mcpIdleConversation is how long an HTTP conversation may go without a request
	// before it ends (a client that left without saying so), and its sessions close.
	mcpIdleConversation = 30 * time.Minute
)

// mcpCommand runs `worker mcp`: an MCP server over stdio (stdin, stdout), or over
// streamable HTTP with --http, whose tools run Python on the fleet through the client.
func mcpCommand(ctx context.Context, args []string, getenv func(string) string, stdin io.Reader, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("mcp", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintln(stderr, "Usage: worker mcp [flags]\n\nServes the fleet's sandboxes as Model Context Protocol tools (run_python, list_sandboxes, open_session, close_session): over stdin and stdout, or over streamable HTTP with --http. --server or NATS_URL names the NATS server (default nats://"+defaultEmbeddedAddr+").\n\nFlags:")
		fs.PrintDefaults()
	}
	httpAddr := fs.String("http", "", "serve streamable HTTP on ADDR (e.g. 127.0.0.1:8811) at "+mcpPath+", instead of stdio")
	tokenFile := fs.String("token-file", "", "with --http, a file holding a secret (16 bytes or more) that every request must carry as `Authorization: Bearer <secret>`; needed unless ADDR is on loopback")
	sandbox := fs.String("sandbox", "default", "the sandbox of a call that names none")
	timeout := fs.Duration("timeout", defaultMCPTimeout, "a call's timeout when it sets none, and the most it may ask for")
	stateless := fs.Bool("stateless", false, "run each call in a fresh process, not in the conversation's session of its sandbox (open_session still opens one)")
	logLevel := fs.String("log-level", "warn", "log level on stderr: debug, info, warn or error")
	server := addServerFlag(fs, getenv)
	auth := addNATSAuthFlags(fs, getenv)
	if err := fs.Parse(args); err != nil {
		return &exitError{code: 2}
	}
	natsOpts, err := auth.options()
	if err != nil {
		return usageError("mcp: %v", err)
	}
	if err := wire.ValidateID("sandbox", *sandbox); err != nil {
		return usageError("mcp: --sandbox: %v", err)
	}
	if *timeout <= 0 || timeout.Seconds() > wire.MaxTimeoutSec {
		return usageError("mcp: --timeout %v must be positive and at most %d s", *timeout, wire.MaxTimeoutSec)
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(*logLevel)); err != nil {
		return usageError("mcp: --log-level: %v", err)
	}
	token, err := readMCPToken(*httpAddr, *tokenFile)
	if err != nil {
		return usageError("mcp: %v", err)
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))

	nc, err := connectMCP(*server, natsOpts)
	if err != nil {
		return &exitError{code: 3, err: err}
	}
	defer nc.Close()
	c, err := client.New(client.Config{Conn: nc, Logger: log})
	if err != nil {
		return &exitError{code: 3, err: err}
	}
	s := newMCPServer(c, *sandbox, *timeout, *stateless, log)
	defer s.convs.closeAll()
	if *httpAddr == "" {
		return s.serveStdio(ctx, stdin, stdout)
	}
	return s.serveHTTP(ctx, *httpAddr, token, stderr)
}

// minMCPToken is the shortest secret --token-file accepts.
const minMCPToken = 16

// readMCPToken returns the secret of tokenFile, with its surrounding whitespace
// trimmed, or "" when there is none. An HTTP address off loopback needs one: whoever
// reaches the endpoint runs code on the fleet.
func readMCPToken(httpAddr, tokenFile string) (string, error) {
	if tokenFile == "" {
		if httpAddr != "" && !onLoopback(httpAddr) {
			return "", fmt.Errorf("--http %s is not on loopback: give --token-file, whose secret every request must carry (whoever reaches the endpoint runs code on the fleet)", httpAddr)
		}
		return "", nil
	}
	if httpAddr == "" {
		return "", errors.New("--token-file is for --http: the stdio transport is the client's own process")
	}
	b, err := os.ReadFile(tokenFile)
	if err != nil {
		return "", fmt.Errorf("--token-file: %w", err)
	}
	token := strings.TrimSpace(string(b))
	if len(token) < minMCPToken {
		return "", fmt.Errorf("--token-file %s holds %d bytes: a secret needs %d or more (e.g. openssl rand -hex 32)", tokenFile, len(token), minMCPToken)
	}
	return token, nil
}

// onLoopback reports whether addr's host is a loopback address or "localhost"; an
// empty host (every interface) is not.
func onLoopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// bearer is the SDK's bearer-token check (auth.RequireBearerToken) against one
// secret, compared in constant time.
func bearer(token string, next http.Handler) http.Handler {
	verify := func(_ context.Context, got string, _ *http.Request) (*auth.TokenInfo, error) {
		if subtle.ConstantTimeCompare([]byte(got), []byte(token)) != 1 {
			return nil, auth.ErrInvalidToken
		}
		return &auth.TokenInfo{UserID: "token"}, nil
	}
	return auth.RequireBearerToken(verify, &auth.RequireBearerTokenOptions{AllowMissingExpiration: true})(next)
}

// connectMCP connects to NATS at url (the embedded server's address when empty).
func connectMCP(url string, opts []nats.Option) (*nats.Conn, error) {
	if url == "" {
		url = "nats://" + defaultEmbeddedAddr
	}
	nc, err := nats.Connect(url, append(opts, nats.Name("jazzmine-mcp"), nats.MaxReconnects(-1))...)
	if err != nil {
		return nil, fmt.Errorf("connect to NATS at %s: %w (is `worker serve` running? --server or NATS_URL picks another server)", url, err)
	}
	return nc, nil
}

// serveStdio serves one conversation over in and out until the client closes in or
// ctx ends.
func (s *mcpServer) serveStdio(ctx context.Context, in io.Reader, out io.Writer) error {
	r, ok := in.(io.ReadCloser) // os.Stdin: closed at the end, so that its reader ends
	if !ok {
		r = io.NopCloser(in)
	}
	t := &mcp.IOTransport{Reader: r, Writer: nopWriteCloser{out}}
	err := s.server.Run(ctx, t)
	if errors.Is(err, context.Canceled) || errors.Is(err, io.EOF) {
		return nil // interrupted, or the client went away: the end of the conversation
	}
	return err
}

// nopWriteCloser is the process's stdout, which the transport must not close.
type nopWriteCloser struct{ io.Writer }

func (nopWriteCloser) Close() error { return nil }

// serveHTTP serves the streamable HTTP transport on addr until ctx ends, each MCP
// session a conversation of its own. It says where on stderr.
func (s *mcpServer) serveHTTP(ctx context.Context, addr, token string, stderr io.Writer) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return &exitError{code: 3, err: fmt.Errorf("mcp: listen on %s: %w", addr, err)}
	}
	var handler http.Handler = mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s.server },
		&mcp.StreamableHTTPOptions{SessionTimeout: mcpIdleConversation, Logger: s.log})
	if token != "" {
		handler = bearer(token, handler)
	}
	mux := http.NewServeMux()
	mux.Handle(mcpPath, handler)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	fmt.Fprintf(stderr, "worker mcp: serving MCP over streamable HTTP at http://%s%s\n", ln.Addr(), mcpPath)
	if token != "" {
		fmt.Fprintln(stderr, "worker mcp: every request must carry the --token-file secret as a bearer token")
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	select {
	case err := <-served:
		return err
	case <-ctx.Done():
	}
	// The conversations first (their sessions close): their streams would keep
	// Shutdown waiting.
	s.convs.closeAll()
	for ss := range s.server.Sessions() {
		_ = ss.Close()
	}
	sctx, cancel := context.WithTimeout(context.Background(), mcpShutdown)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		srv.Close()
	}
	<-served
	return nil
}
