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
	var secrets, meta listFlag
	fs.Var(&secrets, "secret", "a secret the script requires (repeatable)")
	fs.Var(&meta, "meta", "metadata key=value echoed in every event (repeatable)")
	auth := addNATSAuthFlags(fs, getenv)
	if err := fs.Parse(args); err != nil {
		return &exitError{code: 2}
	}
	natsOpts, err := auth.options()
	if err != nil {
		return usageError("submit: %v", err)
	}
	script, err := readScript(*code, fs.Args(), stdin)
	if err != nil {
		return usageError("submit: %v", err)
	}
	ct := wire.ContentTypeMsgpack
	switch *encoding {
	case "msgpack":
	case "json":
		ct = wire.ContentTypeJSON
	default:
		return usageError("submit: --encoding must be msgpack or json")
	}
	job := wire.Job{ExecutionID: *id, Sandbox: *sandbox, Script: script, Mode: *mode, TimeoutSec: *timeout, RequiredSecrets: secrets}
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

	return submitAndFollow(ctx, getenv("NATS_URL"), natsOpts, ct, job, *asJSON, stdout, stderr)
}

// submitAndFollow connects, submits job and prints its events until script_done;
// an interrupt (ctx) cancels the execution and goes on printing how it ends.
func submitAndFollow(ctx context.Context, url string, natsOpts []nats.Option, ct string, job wire.Job, asJSON bool, stdout, stderr io.Writer) error {
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
