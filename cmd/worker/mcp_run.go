package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"path"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/jazzmine/worker/client"
	"github.com/jazzmine/worker/wire"
)

// runInput is what run_python takes.
type runInput struct {
	Script     string      `json:"script" jsonschema:"the Python 3 source to run, as a notebook cell: the value of its last line, when that is an expression, is shown as Out and is the call's result (or emit_result(data))"`
	Sandbox    string      `json:"sandbox,omitempty" jsonschema:"the sandbox to run in (list_sandboxes); the server's default when left out; ignored with session_id"`
	TimeoutSec float64     `json:"timeout_sec,omitempty" jsonschema:"seconds the script may run; the server's timeout when left out, and at most that"`
	Files      []inputFile `json:"files,omitempty" jsonschema:"files written into the workspace (the working directory) before the script runs"`
	SessionID  string      `json:"session_id,omitempty" jsonschema:"run in this session of the conversation (open_session); by default a call runs in the conversation's session of its sandbox"`
}

// inputFile is one of run_python's files.
type inputFile struct {
	Path   string `json:"path" jsonschema:"where the file goes, relative to the workspace, e.g. data/sales.csv"`
	Text   string `json:"text,omitempty" jsonschema:"the file's content as text (UTF-8)"`
	Base64 string `json:"base64,omitempty" jsonschema:"the file's content in base64, for binary files; instead of text"`
}

// runOutput is what run_python returns as structured content; its text content says
// the same for a model.
type runOutput struct {
	ExecutionID    string            `json:"execution_id" jsonschema:"the execution's id on the fleet"`
	Success        bool              `json:"success" jsonschema:"the script ran to its end without an error"`
	Out            map[string]string `json:"out,omitempty" jsonschema:"the value of the script's last line, when that is an expression, as IPython shows it: its text forms by MIME type (text/plain, text/html...)"`
	ExecutionCount int               `json:"execution_count,omitempty" jsonschema:"the number of Out, the call's among its session's"`
	Result         any               `json:"result,omitempty" jsonschema:"the call's result as JSON: what the script gave emit_result, or else the JSON form of Out's value"`
	Stdout         string            `json:"stdout,omitempty" jsonschema:"what the script printed; a long output is cut to its head and tail (see cut)"`
	Stderr         string            `json:"stderr,omitempty"`
	ErrorKind      string            `json:"error_kind,omitempty" jsonschema:"script, timeout, output_limit, crashed, oom, cancelled, session_lost..."`
	Error          string            `json:"error,omitempty"`
	Traceback      string            `json:"traceback,omitempty"`
	Hint           string            `json:"hint,omitempty" jsonschema:"what the error means in this sandbox, and what to do instead"`
	Cut            []cutOut          `json:"cut,omitempty" jsonschema:"the texts cut to their head and tail, with what was left out and where the whole is"`
	CPUMS          float64           `json:"cpu_ms,omitempty" jsonschema:"CPU time the execution used, in milliseconds"`
	PeakMemory     int64             `json:"peak_memory_bytes,omitempty" jsonschema:"the peak resident memory of the script's process"`
	Note           string            `json:"note,omitempty" jsonschema:"what the server did with the conversation's session for this call"`
	Intermediates  []intermediate    `json:"intermediates,omitempty"`
	Logs           []logLine         `json:"logs,omitempty"`
	Displays       []displayOut      `json:"displays,omitempty" jsonschema:"what the script displayed; images come as image content"`
	Artifacts      []fileOut         `json:"artifacts,omitempty" jsonschema:"the files the script left in out/; small ones come as embedded resources"`
	DurationMS     int64             `json:"duration_ms"`
	SessionID      string            `json:"session_id,omitempty"`
}

// cutOut is a text of the call's output cut to its head and tail (see headTail).
type cutOut struct {
	Field string `json:"field" jsonschema:"stdout, stderr, traceback, error or out (Out's text/plain)"`
	leftOut
	URI string `json:"uri,omitempty" jsonschema:"the whole text, a resource of this server (resources/read)"`
}

// intermediate is what a script gave emit_intermediate.
type intermediate struct {
	Label string `json:"label"`
	Data  any    `json:"data,omitempty"`
}

// logLine is what a script gave emit_log.
type logLine struct {
	Level   string `json:"level"`
	Message string `json:"message"`
}

// displayOut is what a script displayed.
type displayOut struct {
	Data  map[string]string `json:"data" jsonschema:"the object's text forms by MIME type (text/plain, text/html...)"`
	Image *fileOut          `json:"image,omitempty"`
}

// fileOut is a file of the execution: a display's image, or an artifact.
type fileOut struct {
	Path        string `json:"path"`
	ContentType string `json:"content_type"`
	Size        int64  `json:"size"`
	Bucket      string `json:"bucket" jsonschema:"the object store bucket that holds it: JAZZMINE_FILES, or a tenant's JAZZMINE_FILES_<tenant>"`
	Object      string `json:"object" jsonschema:"its object in the bucket"`
	Included    bool   `json:"included" jsonschema:"its content is in the result's content"`
}

// runPython runs a script on the fleet and returns its outcome. Its events are sent
// as progress notifications while it runs, when the request has a progress token; a
// cancel from the client (ctx) cancels the execution. Unless the server is
// --stateless or the call names a session, it runs in the conversation's session of
// its sandbox, which its first call opens.
func (s *mcpServer) runPython(ctx context.Context, req *mcp.CallToolRequest, in runInput) (*mcp.CallToolResult, runOutput, error) {
	job, sess, note, err := s.job(ctx, req, in)
	if err != nil {
		return nil, runOutput{}, err
	}
	defer s.removeUploads(ctx, job.Files)
	res, err := s.execute(ctx, req, job, sess)
	if err != nil {
		if sess != nil && in.SessionID == "" && ctx.Err() != nil {
			s.convs.forget(req.Session, sess, "its call was cancelled") // a cancel kills the session's process
		}
		return nil, runOutput{}, err
	}
	if sess != nil && in.SessionID == "" {
		if sess, note, res, err = s.settle(ctx, req, job, sess, res, note); err != nil {
			return nil, runOutput{}, err
		}
	} else if sess != nil && res.ErrorKind == wire.KindSessionLost {
		s.convs.forget(req.Session, sess, "") // open_session opens a new one
	}
	out := outputOf(res)
	out.Note = note
	if sess != nil {
		out.SessionID = sess.ID
	}
	return s.content(ctx, req.Session, res, &out), out, nil
}

// settle deals with how a call of the conversation's own session of its sandbox ended
// for the session, and returns the note of the call's result: a session no worker
// could open (the script did not run) runs the call on its own, statelessly; a
// session lost before the call (it did not run) or with it (a timeout, an output
// limit, a crash, memory: its process was killed) is forgotten, and the next call
// opens a new one and says so. It returns the session the call ran in (nil for
// none), the note and the result.
func (s *mcpServer) settle(ctx context.Context, req *mcp.CallToolRequest, job wire.Job, sess *client.Session, res *client.Result, note string) (*client.Session, string, *client.Result, error) {
	switch res.ErrorKind {
	case wire.KindSessionLimit:
		s.convs.forget(req.Session, sess, "")
		res, err := s.execute(ctx, req, job, nil)
		return nil, "this call ran on its own, in a fresh process: every worker is at its limit of sessions, so the conversation's state is not kept for now", res, err
	case wire.KindSessionLost:
		s.convs.forget(req.Session, sess, "")
		return sess, "the session was lost, and with it the variables, imports and files of earlier calls; this call did not run. The next call starts a new session.", res, nil
	case wire.KindTimeout, wire.KindOutputLimit, wire.KindCrashed, wire.KindOOM, wire.KindCancelled:
		s.convs.forget(req.Session, sess, "its last call ended with "+res.ErrorKind)
		ended := "the session ended with this call (" + res.ErrorKind + "): the next call starts a new one, without the variables, imports and files of earlier calls"
		if note != "" {
			ended = note + "; " + ended
		}
		return sess, ended, res, nil
	}
	return sess, note, res, nil
}

// execute submits job, alone or as a call of sess, and follows it to its end.
func (s *mcpServer) execute(ctx context.Context, req *mcp.CallToolRequest, job wire.Job, sess *client.Session) (*client.Result, error) {
	var exe *client.Execution
	var err error
	if sess != nil {
		exe, err = sess.Submit(ctx, job)
	} else {
		exe, err = s.c.Submit(ctx, job)
	}
	if err != nil {
		return nil, err
	}
	defer exe.Close()
	p := &progress{ss: req.Session, token: req.Params.GetProgressToken()}
	res, err := follow(ctx, exe, p)
	if ctx.Err() != nil {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), client.DefaultCancelTimeout)
		defer cancel()
		if cerr := exe.Cancel(cctx); cerr != nil {
			s.log.Warn("cancel an execution the MCP client cancelled", "execution_id", exe.ID, "err", cerr)
		}
		return nil, fmt.Errorf("execution %s cancelled: %w", exe.ID, ctx.Err())
	}
	return res, err
}

// job makes the job of a run_python call, and finds its session: the one it names,
// or the conversation's of its sandbox (none when the server is --stateless), with a
// note when that one is new in place of one that ended.
func (s *mcpServer) job(ctx context.Context, req *mcp.CallToolRequest, in runInput) (wire.Job, *client.Session, string, error) {
	job := wire.Job{Script: in.Script, Mode: wire.ModeInteractive, Sandbox: in.Sandbox, TimeoutSec: s.timeout.Seconds()}
	if in.TimeoutSec < 0 {
		return job, nil, "", fmt.Errorf("timeout_sec %v is negative", in.TimeoutSec)
	}
	if in.TimeoutSec > 0 {
		job.TimeoutSec = min(in.TimeoutSec, job.TimeoutSec)
	}
	if job.Sandbox == "" {
		job.Sandbox = s.sandbox
	}
	var sess *client.Session
	var note string
	var err error
	switch {
	case in.SessionID != "":
		if sess, err = s.convs.lookup(req.Session, in.SessionID); err != nil {
			return job, nil, "", err
		}
		job.Sandbox = sess.Sandbox
	case !s.stateless && req.Session != nil:
		if err := wire.ValidateID("sandbox", job.Sandbox); err != nil {
			return job, nil, "", err
		}
		if sess, note, err = s.convs.session(req.Session, job.Sandbox); err != nil {
			return job, nil, "", err
		}
	}
	var uploads []upload
	for _, f := range in.Files {
		file, up, err := inputFileOf(f)
		if err != nil {
			return job, nil, "", err
		}
		job.Files = append(job.Files, file)
		if up.data != nil {
			uploads = append(uploads, up)
		}
	}
	// The whole job is checked before anything is uploaded: a call refused for its
	// last file or its sandbox's name leaves nothing in the bucket.
	check := job
	check.ExecutionID = client.NewExecutionID()
	if err := check.Validate("", 0); err != nil {
		return job, nil, "", err
	}
	for _, up := range uploads {
		if err := s.c.PutFile(ctx, up.object, bytes.NewReader(up.data)); err != nil {
			s.removeUploads(ctx, job.Files) // those not put yet are not found: no error
			return job, nil, "", err
		}
	}
	return job, sess, note, nil
}

// upload is a file of a call too large to go in its job: put in the files bucket as
// object before the job is submitted.
type upload struct {
	object string
	data   []byte
}

// inputFileOf makes the job's file of f: inline when small, else named by the object
// it is to be uploaded as.
func inputFileOf(f inputFile) (wire.File, upload, error) {
	if err := wire.ValidatePath("files: path", f.Path); err != nil {
		return wire.File{}, upload{}, err
	}
	data := []byte(f.Text)
	if f.Base64 != "" {
		if f.Text != "" {
			return wire.File{}, upload{}, fmt.Errorf("file %s: give text or base64, not both", f.Path)
		}
		var err error
		if data, err = base64.StdEncoding.DecodeString(f.Base64); err != nil {
			return wire.File{}, upload{}, fmt.Errorf("file %s: base64: %w", f.Path, err)
		}
	}
	file := wire.File{Path: f.Path}
	if len(data) <= client.InlineLimit {
		file.Data = data
		return file, upload{}, nil
	}
	file.Object, file.Bucket = "uploads/"+client.NewExecutionID()+"/"+path.Base(f.Path), wire.FilesBucket
	return file, upload{object: file.Object, data: data}, nil
}

// removeUploads deletes the objects the server put in the files bucket for a call's
// files (only the server names objects: run_python's files have none), once the
// execution has read them or the call failed.
func (s *mcpServer) removeUploads(ctx context.Context, files []wire.File) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	for _, f := range files {
		if f.Object == "" {
			continue
		}
		if err := s.c.DeleteFile(ctx, f.Object); err != nil {
			s.log.Warn("delete a call's upload", "object", f.Object, "err", err)
		}
	}
}

// follow reads the execution's events until its end, sending each as a progress
// notification, and returns its result. It returns early when ctx ends.
func follow(ctx context.Context, exe *client.Execution, p *progress) (*client.Result, error) {
	for {
		select {
		case ev, ok := <-exe.Events():
			if !ok {
				return exe.Wait(ctx)
			}
			p.send(ctx, progressMessage(ev))
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// maxProgress bounds the progress notifications of one call (a script printing in a
// loop); past it, one says that the rest is not reported.
const maxProgress = 500

// progress sends a call's progress notifications, when its request has a token.
type progress struct {
	ss    *mcp.ServerSession
	token any
	n     int
}

func (p *progress) send(ctx context.Context, msg string) {
	if p.token == nil || p.ss == nil || msg == "" || p.n > maxProgress {
		return
	}
	p.n++
	if p.n > maxProgress {
		msg = "(more progress, not reported)"
	}
	// A notification that cannot be sent (the client went away) changes nothing of
	// the run: its end shows in the result, or in ctx.
	_ = p.ss.NotifyProgress(ctx, &mcp.ProgressNotificationParams{ProgressToken: p.token, Message: msg, Progress: float64(p.n)})
}

// progressMessage is the short text of a progress notification for ev; empty for
// the events whose news is the result's.
func progressMessage(ev *wire.Event) string {
	const n = 200
	switch ev.Type {
	case wire.EventStarted:
		return fmt.Sprintf("execution %s started on worker %s", ev.ExecutionID, ev.WorkerID)
	case wire.EventStdout, wire.EventStderr:
		return ev.Type + ": " + short(strings.TrimRight(ev.Text, "\n"), n)
	case wire.EventIntermediate:
		return "intermediate " + ev.Label + ": " + short(valueText(ev.Data), n)
	case wire.EventLog:
		return "log " + ev.Level + ": " + short(ev.Message, n)
	case wire.EventDisplay:
		forms, _ := ev.Data.(map[string]any)
		text, _ := forms["text/plain"].(string)
		return "display: " + short(text, n)
	case wire.EventArtifact:
		return fmt.Sprintf("artifact %s (%d bytes)", ev.Path, ev.Size)
	case wire.EventError:
		return "error (" + ev.Kind + "): " + short(ev.Error, n)
	}
	return ""
}

// short cuts s to at most n bytes on a character boundary, ending in "...".
func short(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && (s[n]&0xC0) == 0x80 {
		n--
	}
	return s[:n] + "..."
}

// outputOf is the structured output of a result, before its files are fetched and
// its long texts cut.
func outputOf(res *client.Result) runOutput {
	out := runOutput{ExecutionID: res.ExecutionID, Success: res.Success, Result: jsonValue(res.FinalData), Stdout: res.Stdout, Stderr: res.Stderr,
		DurationMS: res.DurationMS, CPUMS: res.CPUMS, PeakMemory: res.PeakMemoryBytes}
	if res.Value != nil {
		out.Out, out.ExecutionCount = res.Value.Data, res.ExecutionCount
	}
	if !res.Success {
		out.ErrorKind, out.Error, out.Traceback, out.Hint = res.ErrorKind, res.Error, res.Traceback, res.Hint
	}
	for _, i := range res.Intermediates {
		out.Intermediates = append(out.Intermediates, intermediate{Label: i.Label, Data: jsonValue(i.Data)})
	}
	for _, l := range res.Logs {
		out.Logs = append(out.Logs, logLine{Level: l.Level, Message: l.Message})
	}
	for _, d := range res.Displays {
		out.Displays = append(out.Displays, displayOut{Data: d.Data, Image: fileOf(d.Image)})
	}
	for i := range res.Artifacts {
		out.Artifacts = append(out.Artifacts, *fileOf(&res.Artifacts[i]))
	}
	return out
}

// jsonValue is v, a value of wire.Event.Data, as encoding/json may write it in a
// structured output: NaN and infinities, which it refuses, made null.
func jsonValue(v any) any {
	raw := valueRaw(v)
	if raw == nil {
		return nil
	}
	var out any
	if json.Unmarshal(raw, &out) != nil {
		return nil
	}
	return out
}

// fileOf is the fileOut of a (nil for none), its content not fetched yet.
func fileOf(a *client.Artifact) *fileOut {
	if a == nil {
		return nil
	}
	return &fileOut{Path: a.Path, ContentType: a.ContentType, Size: a.Size, Bucket: a.Bucket, Object: a.Object}
}

// mcpDuration formats a run's duration for a model.
func mcpDuration(ms int64) string { return (time.Duration(ms) * time.Millisecond).String() }
