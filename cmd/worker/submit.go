package main

import (
	"context"
	"encoding/json"
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
	mode := fs.String("mode", "plan", "plan (success needs emit_result) or interactive")
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

	return submitAndFollow(ctx, getenv("NATS_URL"), natsOpts, ct, submission{job: job, files: files, out: *out}, *asJSON, stdout, stderr)
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
		return &exitError{code: 3, err: fmt.Errorf("connect to NATS at %s: %w (is `worker serve` running? NATS_URL picks another server)", url, err)}
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
	p := printer{w: stdout, json: asJSON}
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

// printer shows events as text for a person, or as JSON lines.
type printer struct {
	w    io.Writer
	json bool
}

func (p printer) print(ev *wire.Event) {
	if p.json {
		b, err := json.Marshal(ev)
		if err == nil {
			fmt.Fprintln(p.w, string(b))
		}
		return
	}
	data := func(v any) string {
		b, err := json.Marshal(v)
		if err != nil {
			return fmt.Sprint(v)
		}
		return string(b)
	}
	line := func(label, text string) {
		text = strings.TrimRight(text, "\n")
		for i, l := range strings.Split(text, "\n") {
			if i > 0 {
				label = ""
			}
			fmt.Fprintf(p.w, "  %-13s %s\n", label, l)
		}
	}
	attempt := ""
	if ev.Attempt > 1 {
		attempt = fmt.Sprintf(" (attempt %d)", ev.Attempt)
	}
	switch ev.Type {
	case wire.EventStarted:
		line("started", fmt.Sprintf("container %s on worker %s%s", ev.ContainerID, ev.WorkerID, attempt))
	case wire.EventStdout, wire.EventStderr:
		line(ev.Type, ev.Text)
	case wire.EventIntermediate:
		line("intermediate", ev.Label+" "+data(ev.Data))
	case wire.EventLog:
		line("log", ev.Level+": "+ev.Message)
	case wire.EventFinalResult:
		line("result", data(ev.Data))
	case wire.EventError:
		line("error", ev.Kind+": "+ev.Error)
		if ev.Traceback != "" {
			line("", ev.Traceback)
		}
	case wire.EventArtifact:
		line("artifact", fmt.Sprintf("%s (%d bytes, %s, sha256 %.12s)", ev.Path, ev.Size, ev.ContentType, ev.SHA256))
	case wire.EventDisplay:
		forms, _ := ev.Data.(map[string]any)
		if text, ok := forms["text/plain"].(string); ok {
			line("display", text)
		}
		if ev.Object != "" {
			line("", fmt.Sprintf("image %s (%d bytes, %s)", ev.Path, ev.Size, ev.ContentType))
		}
	case wire.EventScriptDone:
		if ev.Success {
			fmt.Fprintf(p.w, "done: success in %d ms (%d bytes of output)%s\n", ev.DurationMS, ev.OutputBytes, attempt)
		} else {
			fmt.Fprintf(p.w, "done: failed in %d ms: %s%s\n", ev.DurationMS, ev.Error, attempt)
		}
	default:
		line(ev.Type, data(ev))
	}
}
