package main

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/jazzmine/worker/client"
	"github.com/jazzmine/worker/wire"
)

// mcpServer is `worker mcp`: the MCP server and what its tools share.
type mcpServer struct {
	server    *mcp.Server
	c         *client.Client
	sandbox   string        // of a call that names none
	timeout   time.Duration // of a call that sets none, and the most one may ask for
	stateless bool          // each call in a fresh process, not in the conversation's session
	convs     *conversations
	log       *slog.Logger
}

// newMCPServer makes the server and adds its tools, and the resources of the files its
// results name.
func newMCPServer(c *client.Client, sandbox string, timeout time.Duration, stateless bool, log *slog.Logger) *mcpServer {
	s := &mcpServer{c: c, sandbox: sandbox, timeout: timeout, stateless: stateless, convs: newConversations(c, log), log: log}
	s.server = mcp.NewServer(&mcp.Implementation{Name: "jazzmine-worker", Title: "jazzmine Python sandboxes", Version: version},
		&mcp.ServerOptions{Instructions: s.instructions(), Logger: log, Capabilities: &mcp.ServerCapabilities{}})
	state := "It runs in this conversation's session of the sandbox, opened by its first call: variables, imports and files stay from one call to the next, " +
		"as in a notebook, until close_session, the end of the conversation, or 10 minutes idle."
	if stateless {
		state = "Each call starts from nothing (a fresh process, an empty workspace) unless it names a session_id from open_session."
	}
	mcp.AddTool(s.server, &mcp.Tool{
		Name: "run_python",
		Description: fmt.Sprintf("Runs Python 3 code in an isolated sandbox, as a notebook cell: returns what it printed, the value of its last line "+
			"when that is an expression (Out), its error with the traceback, the images it displayed and the files it left in out/. %s "+
			"Sandbox %q unless one is named; timeout %v unless a shorter timeout_sec is given.", state, s.sandbox, s.timeout),
		Annotations: &mcp.ToolAnnotations{OpenWorldHint: ptr(false)},
	}, s.runPython)
	s.server.AddResourceTemplate(&mcp.ResourceTemplate{URITemplate: "jazzmine-files:///{+object}", Name: "files",
		Description: "A file a run_python result named: the whole of a long output, an artifact or image too large to include.", MIMEType: "application/octet-stream"},
		s.readFile)
	mcp.AddTool(s.server, &mcp.Tool{
		Name:        "list_sandboxes",
		Description: "Lists the sandboxes run_python may use: for each, its tools (functions scripts call as plain globals) with their signatures and docstrings, its Python version, Debian and pip packages, limits and network access.",
		Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true},
	}, s.listSandboxes)
	mcp.AddTool(s.server, &mcp.Tool{
		Name: "open_session",
		Description: "Opens this conversation's session of a sandbox, or returns the one already open (the one run_python uses by default): its calls run one at a time " +
			"in one Python process that keeps its state. It ends with close_session, when this conversation ends, or when idle for the fleet's idle time (10 minutes by default); " +
			"a call after that says the session was lost, and the next call opens a new one.",
	}, s.openSession)
	mcp.AddTool(s.server, &mcp.Tool{
		Name:        "close_session",
		Description: "Closes a session of this conversation: its process, variables and files are gone; the next run_python in its sandbox starts a new one.",
		Annotations: &mcp.ToolAnnotations{DestructiveHint: ptr(true), IdempotentHint: true},
	}, s.closeSession)
	return s
}

func ptr[T any](v T) *T { return &v }

// instructions tell a model what the sandbox is, in the server's initialize answer.
func (s *mcpServer) instructions() string {
	state := "Calls of this conversation in one sandbox share a session, as the cells of a notebook share a kernel: variables, imports and files in /workspace stay from one call to the next, until close_session, the end of the conversation, or 10 minutes idle (a result then says the session was lost, and the next call starts a new one)."
	if s.stateless {
		state = "Each call starts from nothing: a fresh process, an empty /workspace (the working directory) and /tmp. To keep state between calls, open_session, then pass its session_id to run_python."
	}
	return fmt.Sprintf(`Runs Python 3 in isolated sandboxes (hardened containers of a jazzmine fleet).
- run_python runs code as a notebook cell and returns what it did: what it printed, and the value of its last line when that is an expression (Out[n], as IPython shows it). %s
- In a script: print() and a last expression are usually all you need; emit_result(data) sets the call's result explicitly; emit_intermediate(label, data) and emit_log(message, level="info") report progress; display(obj) shows an object as Jupyter would (a matplotlib figure, plt.show() or left open, comes back as an image). Long output is cut to its head and tail; the whole is a resource the result names.
- The sandbox's tools are plain functions already in the script's globals: list_sandboxes gives their signatures and docstrings.
- Input files (run_python's files) are written into /workspace before the script runs; files the script leaves in /workspace/out come back.
- No network unless the sandbox lists allowed hosts (list_sandboxes), and no pip: the packages are the sandbox's (list_sandboxes). The root filesystem is read-only; memory, CPU and time are limited (default sandbox %q, timeout %v).`, state, s.sandbox, s.timeout)
}

// sandboxesOutput is what list_sandboxes returns.
type sandboxesOutput struct {
	Sandboxes []client.SandboxInfo `json:"sandboxes" jsonschema:"the sandboxes the fleet serves, by name"`
}

// listSandboxes returns the fleet's sandbox catalog.
func (s *mcpServer) listSandboxes(ctx context.Context, _ *mcp.CallToolRequest, _ struct{}) (*mcp.CallToolResult, sandboxesOutput, error) {
	list, err := s.c.Sandboxes(ctx)
	if err != nil {
		return nil, sandboxesOutput{}, fmt.Errorf("list the sandboxes: %w", err)
	}
	if list == nil {
		list = []client.SandboxInfo{}
	}
	return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: describeSandboxes(list)}}}, sandboxesOutput{Sandboxes: list}, nil
}

// describeSandboxes is the catalog as a model reads it best: each sandbox, its limits,
// and its tools as Python stubs with their docstrings.
func describeSandboxes(list []client.SandboxInfo) string {
	if len(list) == 0 {
		return "No sandbox is served yet (a worker lists its sandboxes once their first container is ready)."
	}
	var b strings.Builder
	for _, sb := range list {
		fmt.Fprintf(&b, "sandbox %s", sb.Sandbox)
		if sb.Description != "" {
			fmt.Fprintf(&b, ": %s", sb.Description)
		}
		if sb.Building {
			fmt.Fprintf(&b, "\n  its image is being built: a run waits until a worker serves it (seconds to minutes)\n")
			continue
		}
		if sb.Error != "" {
			// No worker serves it: a job of it waits until one does.
			fmt.Fprintf(&b, "\n  unavailable: %s\n", sb.Error)
			continue
		}
		network := "no network"
		if len(sb.AllowedHosts) > 0 {
			network = "network to " + strings.Join(sb.AllowedHosts, ", ")
		}
		fmt.Fprintf(&b, "\n  Python %s; timeout %v s by default; %d MiB of memory, %v CPU, %d MiB of workspace; %s\n",
			sb.Python, sb.TimeoutSec, sb.MemoryMB, sb.CPUs, sb.WorkspaceMB, network)
		if len(sb.AptPackages) > 0 {
			fmt.Fprintf(&b, "  Debian packages: %s\n", strings.Join(sb.AptPackages, ", "))
		}
		if len(sb.Packages) > 0 {
			fmt.Fprintf(&b, "  pip packages: %s\n", strings.Join(sb.Packages, ", "))
		}
		for _, t := range sb.Tools {
			// An async def too: scripts call it as a plain function.
			fmt.Fprintf(&b, "  def %s%s\n", t.Name, t.Signature)
			if t.Doc != "" {
				fmt.Fprintf(&b, "      %s\n", strings.ReplaceAll(t.Doc, "\n", "\n      "))
			}
		}
		for _, e := range sb.ToolErrors {
			fmt.Fprintf(&b, "  (failed to load: %s)\n", e)
		}
	}
	return b.String()
}

// sessionInput is what open_session takes.
type sessionInput struct {
	Sandbox string `json:"sandbox,omitempty" jsonschema:"the sandbox of the session; the server's default sandbox when left out"`
}

// sessionOutput is what open_session and close_session return.
type sessionOutput struct {
	SessionID string `json:"session_id" jsonschema:"the session's id, for run_python's session_id"`
	Sandbox   string `json:"sandbox" jsonschema:"the session's sandbox"`
	Closed    bool   `json:"closed,omitempty" jsonschema:"the session was closed"`
}

// openSession opens the conversation's session of a sandbox, or returns it.
func (s *mcpServer) openSession(ctx context.Context, req *mcp.CallToolRequest, in sessionInput) (*mcp.CallToolResult, sessionOutput, error) {
	sandbox := in.Sandbox
	if sandbox == "" {
		sandbox = s.sandbox
	}
	if err := wire.ValidateID("sandbox", sandbox); err != nil {
		return nil, sessionOutput{}, err
	}
	sess, err := s.convs.open(ctx, req.Session, sandbox)
	if err != nil {
		return nil, sessionOutput{}, err
	}
	return nil, sessionOutput{SessionID: sess.ID, Sandbox: sess.Sandbox}, nil
}

// closeInput is what close_session takes.
type closeInput struct {
	SessionID string `json:"session_id" jsonschema:"the id open_session returned"`
}

// closeSession closes a session of the conversation.
func (s *mcpServer) closeSession(ctx context.Context, req *mcp.CallToolRequest, in closeInput) (*mcp.CallToolResult, sessionOutput, error) {
	sess, err := s.convs.close(ctx, req.Session, in.SessionID)
	if err != nil {
		return nil, sessionOutput{}, err
	}
	return nil, sessionOutput{SessionID: sess.ID, Sandbox: sess.Sandbox, Closed: true}, nil
}
