package client_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/jazzmine/worker/client"
	"github.com/jazzmine/worker/wire"
)

// Submit a script to the sandbox "default", print its output as it comes,
// then its result. It needs a NATS server with a jazzmine worker.
func Example() {
	nc, err := nats.Connect(nats.DefaultURL)
	if err != nil {
		log.Fatal(err)
	}
	defer nc.Close()

	c, err := client.New(client.Config{Conn: nc})
	if err != nil {
		log.Fatal(err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	e, err := c.Submit(ctx, wire.Job{
		Sandbox: "default",
		Script:  "print('thinking'); emit_result({'answer': 6 * 7})",
	})
	switch {
	case errors.Is(err, client.ErrBacklogFull):
		log.Fatal("the workers are busy, try again later")
	case err != nil:
		log.Fatal(err)
	}
	defer e.Close()

	for ev := range e.Events() {
		if ev.Type == wire.EventStdout {
			fmt.Print(ev.Text)
		}
	}
	res, err := e.Wait(ctx)
	if err != nil {
		log.Fatal(err)
	}
	if !res.Success {
		log.Fatalf("%s failed (%s): %s", e.ID, res.ErrorKind, res.Error)
	}
	fmt.Println(res.FinalData)
}

// Run is Submit, Wait and Close in one call.
func ExampleClient_Run() {
	nc, err := nats.Connect(nats.DefaultURL)
	if err != nil {
		log.Fatal(err)
	}
	defer nc.Close()
	c, err := client.New(client.Config{Conn: nc, ContentType: wire.ContentTypeJSON})
	if err != nil {
		log.Fatal(err)
	}
	res, err := c.Run(context.Background(), wire.Job{Sandbox: "default", Script: "emit_result(1 + 1)"})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(res.Success, res.FinalData)
}
