package client_test

import (
	"context"
	"errors"
	"go/ast"
	"go/parser"
	"go/token"
	"io"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jazzmine/worker/client"
	"github.com/jazzmine/worker/internal/testenv"
	"github.com/jazzmine/worker/internal/testworker"
	"github.com/jazzmine/worker/sandboxpool"
	"github.com/jazzmine/worker/wire"
)

// examples are the package's Example functions, run by TestTheExamplesPrintWhatTheySay.
var examples = map[string]func(){
	"Example":                  Example,
	"ExampleClient_Submit":     ExampleClient_Submit,
	"ExampleExecution_Cancel":  ExampleExecution_Cancel,
	"ExampleClient_Download":   ExampleClient_Download,
	"ExampleClient_NewSession": ExampleClient_NewSession,
	"ExampleResult_Decode":     ExampleResult_Decode,
}

// TestTheExamplesPrintWhatTheySay runs each Example of example_test.go against a real
// worker (NATS_URL names its server, as the examples read it) and compares what it
// prints with the "// Prints:" comment at its end. The comment is not go test's
// "// Output:", which would run the examples with no worker to talk to.
func TestTheExamplesPrintWhatTheySay(t *testing.T) {
	srv, nc := testenv.NATS(t)
	testworker.Start(t, nc, testworker.Options{Sandbox: sandboxpool.Sandbox{PoolSize: 1, MaxOverflow: 2}})
	t.Setenv("NATS_URL", srv.ClientURL())
	want := printsComments(t, "example_test.go")
	if len(want) != len(examples) {
		t.Fatalf("%d examples say what they print, %d are run: add the new one to examples", len(want), len(examples))
	}
	for name, run := range examples {
		t.Run(name, func(t *testing.T) {
			if got := stdoutOf(t, run); got != want[name] {
				t.Errorf("%s printed\n%s\nwant\n%s", name, got, want[name])
			}
		})
	}
}

// printsComments returns, for each function of file, the lines of its "// Prints:"
// comment.
func printsComments(t *testing.T, file string) map[string]string {
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, file, nil, parser.ParseComments)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, decl := range f.Decls {
		fn, ok := decl.(*ast.FuncDecl)
		if !ok {
			continue
		}
		for _, group := range f.Comments {
			if group.Pos() < fn.Body.Lbrace || group.End() > fn.Body.Rbrace {
				continue
			}
			text := group.Text()
			if rest, ok := strings.CutPrefix(text, "Prints:\n"); ok {
				out[fn.Name.Name] = rest
			}
		}
	}
	return out
}

// stdoutOf runs f and returns what it wrote to os.Stdout.
func stdoutOf(t *testing.T, f func()) string {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	saved := os.Stdout
	os.Stdout = w
	done := make(chan string)
	go func() {
		b, _ := io.ReadAll(r)
		done <- string(b)
	}()
	defer func() { os.Stdout = saved }()
	f()
	w.Close()
	return <-done
}

// TestRunCancelsTheJobWhenItsContextEnds gives up on a job that runs too long: Run
// returns the context's error, and the job ends cancelled on the fleet instead of
// holding its container until its own timeout.
func TestRunCancelsTheJobWhenItsContextEnds(t *testing.T) {
	srv, nc := testenv.NATS(t)
	testworker.Start(t, nc, testworker.Options{Sandbox: sandboxpool.Sandbox{PoolSize: 1, MaxOverflow: 0}})
	c, err := client.Connect(srv.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	id := client.NewExecutionID()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	if _, err := c.Run(ctx, wire.Job{ExecutionID: id, Script: "import time\ntime.sleep(600)"}); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Run: %v, want the context's deadline", err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	var kind string
	testenv.WaitFor(t, time.Minute, "the job's end on the fleet", func() bool {
		stream, err := js.Stream(context.Background(), wire.StreamEvents)
		if err != nil {
			return false
		}
		msg, err := stream.GetLastMsgForSubject(context.Background(), wire.EventSubject(id, wire.EventError))
		if err != nil {
			return false
		}
		ev, err := wire.DecodeEvent(msg.Header.Get(wire.HeaderContentType), msg.Data)
		kind = ev.Kind
		return err == nil
	})
	if kind != wire.KindCancelled {
		t.Errorf("the job ended with an error of kind %q, want cancelled", kind)
	}
}
