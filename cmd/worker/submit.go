package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/jazzmine/worker/client"
	"github.com/jazzmine/worker/wire"
)

// listFlag is a repeatable flag.
type listFlag []string

func (l *listFlag) String() string     { return strings.Join(*l, ",") }
func (l *listFlag) Set(v string) error { *l = append(*l, v); return nil }

func submit(ctx context.Context, args []string, getenv func(string) string, stdin io.Reader, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("submit", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintln(stderr, "Usage: worker submit [flags] (-e SCRIPT | FILE | -)\n\nSubmits a job and streams its events. Exit code 0: the script succeeded; 1: it failed; 2: bad usage; 3: the job could not be submitted.\n\nFlags:")
		fs.PrintDefaults()
	}
	sandbox := fs.String("sandbox", "default", "the sandbox to run in")
	code := fs.String("e", "", "the script itself, instead of a file")
	id := fs.String("id", "", "execution id (default: a new one)")
	mode := fs.String("mode", wire.ModeInteractive, "interactive (a notebook cell: printing is enough) or plan (success needs a result: a last expression or emit_result)")
	timeout := fs.Float64("timeout", 0, "script timeout in seconds (default: the worker's, 30)")
	encoding := fs.String("encoding", "msgpack", "job encoding: msgpack or json")
	asJSON := fs.Bool("json", false, "print each event as a JSON line instead of text")
	var secrets, meta, files listFlag
	fs.Var(&secrets, "secret", "a secret the script requires (repeatable)")
	fs.Var(&meta, "meta", "metadata key=value echoed in every event (repeatable)")
	fs.Var(&files, "file", "LOCAL[:PATH]: a local file the script finds at PATH in /workspace, its base name by default (repeatable)")
	session := fs.String("session", "", "run as a call of session ID (opened by its first call; its globals, imports and files stay for the next)")
	closeSession := fs.Bool("close-session", false, "end the --session after this call (the script may then be left out)")
	out := fs.String("out", "", "a directory to save the execution's artifacts and display images in, at their workspace paths")
	server := addServerFlag(fs, getenv)
	auth := addNATSAuthFlags(fs, getenv)
	if err := fs.Parse(args); err != nil {
		return &exitError{code: 2}
	}
	natsOpts, err := auth.options()
	if err != nil {
		return usageError("submit: %v", err)
	}
	var script string
	if !*closeSession || *code != "" || len(fs.Args()) > 0 {
		if script, err = readScript(*code, fs.Args(), stdin); err != nil {
			return usageError("submit: %v", err)
		}
	}
	ct := wire.ContentTypeMsgpack
	switch *encoding {
	case "msgpack":
	case "json":
		ct = wire.ContentTypeJSON
	default:
		return usageError("submit: --encoding must be msgpack or json")
	}
	job := wire.Job{ExecutionID: *id, Sandbox: *sandbox, Script: script, Mode: *mode, TimeoutSec: *timeout, RequiredSecrets: secrets,
		SessionID: *session, SessionClose: *closeSession}
	for _, kv := range meta {
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			return usageError("submit: --meta %q is not key=value", kv)
		}
		if job.Metadata == nil {
			job.Metadata = map[string]string{}
		}
		job.Metadata[k] = v
	}

	return submitAndFollow(ctx, *server, natsOpts, ct, submission{job: job, files: files, out: *out}, *asJSON, stdout, stderr)
}

// submission is what submit sends: the job, the local files it brings (LOCAL[:PATH])
// and where the artifacts go.
type submission struct {
	job   wire.Job
	files []string
	out   string
}

// addFiles adds the submission's local files to its job: inline when small, else
// uploaded to the object store.
func (s *submission) addFiles(ctx context.Context, c *client.Client) error {
	for _, spec := range s.files {
		local, path, _ := strings.Cut(spec, ":")
		f, err := c.InputFile(ctx, local, path)
		if err != nil {
			return fmt.Errorf("--file %s: %w", spec, err)
		}
		s.job.Files = append(s.job.Files, f)
	}
	return nil
}

// save downloads the result's artifacts and display images into the out directory,
// saying where each went.
func (s *submission) save(ctx context.Context, c *client.Client, res *client.Result, stdout io.Writer) error {
	if s.out == "" {
		return nil
	}
	all := make([]*client.Artifact, 0, len(res.Artifacts)+len(res.Displays))
	for i := range res.Artifacts {
		all = append(all, &res.Artifacts[i])
	}
	for _, d := range res.Displays {
		if d.Image != nil {
			all = append(all, d.Image)
		}
	}
	if err := os.MkdirAll(s.out, 0o755); err != nil {
		return err
	}
	for _, a := range all {
		path, err := c.Save(ctx, a, s.out)
		if err != nil {
			return fmt.Errorf("save %s: %w", a.Path, err)
		}
		fmt.Fprintf(stdout, "saved %s (%d bytes, %s)\n", path, a.Size, a.ContentType)
	}
	return nil
}

// submitAndFollow connects, submits job and prints its events until script_done;
// an interrupt (ctx) cancels the execution and goes on printing how it ends.
func submitAndFollow(ctx context.Context, url string, natsOpts []nats.Option, ct string, s submission, asJSON bool, stdout, stderr io.Writer) error {
	if url == "" {
		url = "nats://" + defaultEmbeddedAddr
	}
	nc, err := nats.Connect(url, append(natsOpts, nats.Name("jazzmine-submit"))...)
	if err != nil {
		return &exitError{code: 3, err: fmt.Errorf("connect to NATS at %s: %w (is `worker serve` running? --server or NATS_URL picks another server)", url, err)}
	}
	defer nc.Close()
	c, err := client.New(client.Config{Conn: nc, ContentType: ct})
	if err != nil {
		return &exitError{code: 3, err: err}
	}
	if err := s.addFiles(ctx, c); err != nil {
		return &exitError{code: 3, err: err}
	}
	job := s.job
	exe, err := c.Submit(ctx, job)
	if err != nil {
		if errors.Is(err, wire.ErrInvalidJob) {
			return usageError("%v", err)
		}
		return &exitError{code: 3, err: err}
	}
	defer exe.Close()
	if !asJSON {
		fmt.Fprintf(stdout, "submitted %s to sandbox %s\n", exe.ID, job.Sandbox)
	}
	p := &printer{w: stdout, json: asJSON}
	events := exe.Events()
	for {
		select {
		case ev, ok := <-events:
			if !ok {
				res, err := exe.Wait(context.Background())
				if err != nil {
					return err
				}
				if err := s.save(context.Background(), c, res, stdout); err != nil {
					return err
				}
				if !res.Success {
					return &exitError{code: 1}
				}
				return nil
			}
			p.print(ev)
		case <-ctx.Done():
			// Interrupted: cancel the execution and show how it ends.
			fmt.Fprintln(stderr, "interrupted: cancelling", exe.ID)
			cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			err := exe.Cancel(cctx)
			cancel()
			if err != nil {
				return err
			}
			ctx = context.Background()
		}
	}
}

func readScript(code string, args []string, stdin io.Reader) (string, error) {
	switch {
	case code != "" && len(args) > 0:
		return "", errors.New("give the script with -e or as a file, not both")
	case code != "":
		return code, nil
	case len(args) != 1:
		return "", errors.New("give the script with -e SCRIPT, as a FILE, or - for standard input")
	case args[0] == "-":
		b, err := io.ReadAll(stdin)
		return string(b), err
	default:
		b, err := os.ReadFile(args[0])
		return string(b), err
	}
}

// printer shows events as text for a person, or as JSON lines. For a person, the
// execution's printed output is cut to its head and tail (see headTail): its first
// cutLines lines (at most cutBytes) as they come, then what the last cutLines hold,
// shown at the end after a line saying what was left out; --json prints it all.
type printer struct {
	w    io.Writer
	json bool

	shown   int       // bytes of output printed as it came
	lines   int       // lines of output printed as it came
	held    []heldOut // the latest output past the head, printed at the end
	heldLen int       // their bytes
	left    leftOut   // output past the head no longer held

	shownValue bool // an execute_result was printed: its final_result is not
}

// heldOut is a piece of output held back for the tail: its label and text.
type heldOut struct{ label, text string }

func (p *printer) print(ev *wire.Event) {
	if p.json {
		if b, err := wire.EncodeEvent(wire.ContentTypeJSON, ev); err == nil {
			fmt.Fprintln(p.w, string(b))
		}
		return
	}
	attempt := ""
	if ev.Attempt > 1 {
		attempt = fmt.Sprintf(" (attempt %d)", ev.Attempt)
	}
	switch ev.Type {
	case wire.EventStdout, wire.EventStderr:
	case wire.EventLog, wire.EventIntermediate:
		if p.held != nil { // in the midst of a long output: held with it, in its order
			p.output(ev.Type, p.describe(ev)+"\n")
			return
		}
	default:
		p.flushTail() // the output so far ends before what comes next
	}
	switch ev.Type {
	case wire.EventStarted:
		p.line("started", fmt.Sprintf("container %s on worker %s%s", ev.ContainerID, ev.WorkerID, attempt))
	case wire.EventStdout, wire.EventStderr:
		p.output(ev.Type, ev.Text)
	case wire.EventIntermediate, wire.EventLog:
		p.line(ev.Type, p.describe(ev))
	case wire.EventFinalResult:
		if !p.shownValue { // the value of an Out just shown, as JSON: said once
			p.line("result", valueText(ev.Data))
		}
	case wire.EventExecuteResult:
		p.shownValue = true
		var b strings.Builder
		outPrompt(&b, ev.ExecutionCount, formText(ev.Data))
		p.line("", strings.TrimRight(b.String(), "\n"))
		if ev.Object != "" {
			p.line("", fmt.Sprintf("image %s (%d bytes, %s)", ev.Path, ev.Size, ev.ContentType))
		}
	case wire.EventError:
		p.line("error", ev.Kind+": "+ev.Error)
		if ev.Traceback != "" {
			tb, _ := headTail(ev.Traceback)
			p.line("", tb)
		}
		if ev.Hint != "" {
			p.line("hint", ev.Hint)
		}
	case wire.EventArtifact:
		p.line("artifact", fmt.Sprintf("%s (%d bytes, %s, sha256 %.12s)", ev.Path, ev.Size, ev.ContentType, ev.SHA256))
	case wire.EventDisplay:
		p.line("display", formText(ev.Data))
		if ev.Object != "" {
			p.line("", fmt.Sprintf("image %s (%d bytes, %s)", ev.Path, ev.Size, ev.ContentType))
		}
	case wire.EventScriptDone:
		usage := usageLine(ev.CPUMS, ev.PeakMemoryBytes)
		if usage != "" {
			usage = "; " + usage
		}
		if ev.Success {
			fmt.Fprintf(p.w, "done: success in %d ms%s (%d bytes of output)%s\n", ev.DurationMS, usage, ev.OutputBytes, attempt)
		} else {
			fmt.Fprintf(p.w, "done: failed in %d ms%s: %s%s\n", ev.DurationMS, usage, ev.Error, attempt)
		}
	default:
		p.line(ev.Type, valueText(ev))
	}
}

// describe is the text of a log or an intermediate event.
func (p *printer) describe(ev *wire.Event) string {
	if ev.Type == wire.EventLog {
		return ev.Level + ": " + ev.Message
	}
	return ev.Label + " " + valueText(ev.Data)
}

// formText is the text/plain of a display's or an execute_result's data.
func formText(data any) string {
	forms, _ := data.(map[string]any)
	text, _ := forms["text/plain"].(string)
	return text
}

// line prints text under label, the label on its first line only.
func (p *printer) line(label, text string) {
	text = strings.TrimRight(text, "\n")
	for i, l := range strings.Split(text, "\n") {
		if i > 0 {
			label = ""
		}
		fmt.Fprintf(p.w, "  %-13s %s\n", label, l)
	}
}

// output prints a piece of the script's output while the head lasts, and holds the
// rest for the tail, letting go of the oldest held pieces past cutLines and cutBytes.
func (p *printer) output(label, text string) {
	if p.held == nil && p.lines < cutLines && p.shown < cutBytes {
		head := linesFromStart(text, cutLines-p.lines, cutBytes-p.shown)
		p.line(label, head)
		p.shown += len(head)
		p.lines += strings.Count(head, "\n")
		text = text[len(head):]
		if text == "" {
			return
		}
	}
	p.held = append(p.held, heldOut{label, text})
	p.heldLen += len(text)
	for len(p.held) > 1 && (p.heldLen > cutBytes || p.heldLines() > cutLines) {
		p.drop(p.held[0].text)
		p.held = p.held[1:]
	}
	if len(p.held) == 1 && (p.heldLen > cutBytes || p.heldLines() > cutLines) {
		keep := linesFromEnd(p.held[0].text, cutLines, cutBytes)
		p.drop(p.held[0].text[:len(p.held[0].text)-len(keep)])
		p.held[0].text = keep
	}
}

func (p *printer) drop(text string) {
	p.heldLen -= len(text)
	p.left.Bytes += len(text)
	p.left.Lines += strings.Count(text, "\n")
}

// flushTail prints what was left out of the output, if anything, and the held tail;
// output that comes after it starts a head of its own.
func (p *printer) flushTail() {
	if p.left.Bytes > 0 {
		if p.left.Lines == 0 {
			p.left.Lines = 1 // a line cut in two
		}
		fmt.Fprintf(p.w, "  %-13s %s (worker submit --json shows the whole)\n", "", p.left.marker())
	}
	for _, h := range p.held {
		p.line(h.label, h.text)
	}
	p.held, p.heldLen, p.left, p.shown, p.lines = nil, 0, leftOut{}, 0, 0
}

func (p *printer) heldLines() int {
	n := 0
	for _, h := range p.held {
		n += strings.Count(h.text, "\n")
	}
	return n
}
