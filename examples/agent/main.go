// Command agent runs a cell of Python on a jazzmine fleet: the README's example.
// NATS_URL names the server; empty means nats://127.0.0.1:4222, where `make run`
// listens.
package main

import (
	"context"
	"fmt"
	"log"
	"os"

	"github.com/jazzmine/worker/client"
	"github.com/jazzmine/worker/wire"
)

func main() {
	c, err := client.Connect(os.Getenv("NATS_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	res, err := c.Run(context.Background(), wire.Job{
		Script: "import statistics\nprint('computing')\nstatistics.mean([3, 5, 10])",
	})
	if err != nil {
		log.Fatal(err)
	}
	if !res.Success {
		log.Fatalf("%s: %s\n%s%s", res.ErrorKind, res.Error, res.Traceback, res.Hint)
	}
	var mean float64
	if err := res.Decode(&mean); err != nil {
		log.Fatal(err)
	}
	fmt.Print(res.Stdout)
	fmt.Println("Out:", res.Value.Data["text/plain"], "as a float64:", mean)
}
