package client_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"strings"
	"time"

	"github.com/jazzmine/worker/client"
	"github.com/jazzmine/worker/wire"
)

// Run a cell of Python on the fleet and read what it gave back: the value of its last
// line, as IPython shows it, and as a Go value. NATS_URL names the server (empty:
// nats://127.0.0.1:4222, where `make run` listens).
func Example() {
	c, err := client.Connect(os.Getenv("NATS_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	res, err := c.Run(context.Background(), wire.Job{Script: "import statistics\nstatistics.mean([3, 5, 10])"})
	if err != nil {
		log.Fatal(err)
	}
	if !res.Success {
		log.Fatalf("%s: %s\n%s", res.ErrorKind, res.Error, res.Traceback)
	}
	var mean float64
	if err := res.Decode(&mean); err != nil {
		log.Fatal(err)
	}
	fmt.Println("Out:", res.Value.Data["text/plain"])
	fmt.Println(mean * 2)
	// Prints:
	// Out: 6
	// 12
}

// Stream an execution's events as they come: what it prints, and what it reports on
// the way with emit_intermediate, before its end.
func ExampleClient_Submit() {
	c, err := client.Connect(os.Getenv("NATS_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	e, err := c.Submit(ctx, wire.Job{Script: "for step in range(3):\n    print('step', step)\n    emit_intermediate('progress', step / 2)"})
	switch {
	case errors.Is(err, client.ErrBacklogFull):
		log.Fatal("the workers are busy, try again later")
	case err != nil:
		log.Fatal(err)
	}
	defer e.Close()
	for ev := range e.Events() {
		switch ev.Type {
		case wire.EventStdout:
			fmt.Print(ev.Text)
		case wire.EventIntermediate:
			fmt.Println(ev.Label, ev.Data)
		}
	}
	res, err := e.Wait(ctx)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("success:", res.Success)
	// Prints:
	// step 0
	// progress 0
	// step 1
	// progress 0.5
	// step 2
	// progress 1
	// success: true
}

// Cancel an execution that runs too long; Run cancels its own when its context ends.
func ExampleExecution_Cancel() {
	c, err := client.Connect(os.Getenv("NATS_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	ctx := context.Background()
	e, err := c.Submit(ctx, wire.Job{Script: "import time\nprint('started', flush=True)\ntime.sleep(60)"})
	if err != nil {
		log.Fatal(err)
	}
	defer e.Close()
	for ev := range e.Events() {
		if ev.Type == wire.EventStdout { // it runs: stop it
			if err := e.Cancel(ctx); err != nil {
				log.Fatal(err)
			}
		}
	}
	res, err := e.Wait(ctx)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(res.Success, res.ErrorKind)
	// Prints:
	// false cancelled
}

// Send a file in and get the files a script leaves in out/ back.
func ExampleClient_Download() {
	c, err := client.Connect(os.Getenv("NATS_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	ctx := context.Background()
	res, err := c.Run(ctx, wire.Job{
		Files: []wire.File{{Path: "data/words.txt", Data: []byte("the cat and the hat")}},
		Script: `import collections, os
words = open("data/words.txt").read().split()
os.makedirs("out")
with open("out/counts.csv", "w") as f:
    for word, n in collections.Counter(words).most_common():
        f.write(f"{word},{n}\n")`,
	})
	if err != nil {
		log.Fatal(err)
	}
	for _, a := range res.Artifacts {
		var b bytes.Buffer
		if err := c.Download(ctx, &a, &b); err != nil {
			log.Fatal(err)
		}
		fmt.Printf("%s (%s):\n%s", a.Path, a.ContentType, b.String())
	}
	// Prints:
	// out/counts.csv (text/csv):
	// the,2
	// cat,1
	// and,1
	// hat,1
}

// A session's calls run one at a time in one Python process, which keeps its
// variables, imports and files from one call to the next, as a notebook's cells do.
func ExampleClient_NewSession() {
	c, err := client.Connect(os.Getenv("NATS_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	ctx := context.Background()
	s := c.NewSession(client.DefaultSandbox)
	defer s.Close(ctx)
	for _, cell := range []string{"x = 20", "x += 1", "x * 2"} {
		res, err := s.Run(ctx, wire.Job{Script: cell})
		if err != nil {
			log.Fatal(err)
		}
		if res.Value != nil {
			fmt.Printf("Out[%d]: %s\n", res.ExecutionCount, res.Value.Data["text/plain"])
		}
	}
	// Prints:
	// Out[3]: 42
}

// The value of a script's last line, or what it gave emit_result, decoded into a Go
// value as encoding/json would.
func ExampleResult_Decode() {
	c, err := client.Connect(os.Getenv("NATS_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	res, err := c.Run(context.Background(), wire.Job{Script: "{'word': 'cat', 'count': len('cat'), 'seen': ['a', 'b']}"})
	if err != nil {
		log.Fatal(err)
	}
	var got struct {
		Word  string
		Count int
		Seen  []string
	}
	if err := res.Decode(&got); err != nil {
		log.Fatal(err)
	}
	fmt.Println(got.Word, got.Count, strings.Join(got.Seen, "+"))
	// Prints:
	// cat 3 a+b
}
