package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/jazzmine/worker/proxy"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Getenv, os.Stdin, os.Stdout, os.Stderr)
	stop()
	os.Exit(exitCode(err))
}

// exitError carries an exit code other than 1.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string { return e.err.Error() }
func (e *exitError) Unwrap() error { return e.err }

// usageError is a command line that cannot be run: exit code 2.
func usageError(format string, args ...any) error {
	return &exitError{code: 2, err: fmt.Errorf(format, args...)}
}

func exitCode(err error) int {
	if err == nil {
		return 0
	}
	var ee *exitError
	if errors.As(err, &ee) {
		if ee.err != nil {
			fmt.Fprintln(os.Stderr, "worker:", ee.err)
		}
		return ee.code
	}
	fmt.Fprintln(os.Stderr, "worker:", err)
	return 1
}

const usage = `worker: the jazzmine execution worker

Usage:
  worker serve   [--config FILE] [flags]   run the worker (embedded NATS unless NATS_URL is set)
  worker submit  [flags] (-e SCRIPT | FILE | -)  submit a job and stream its events
  worker mcp     [--http ADDR] [flags]     serve the fleet as MCP tools (run_python...), over stdio or HTTP
  worker build   [--config FILE]           build the sandbox images and exit
  worker proxy   [--config-json JSON]      run the egress proxy (config also from JAZZMINE_PROXY_CONFIG)
  worker nats-auth --worker KEY --tenant NAME=KEY...  print the NATS server's roles and tenants
  worker nkey    [--out DIR] NAME...       make NATS user keys: DIR/NAME.seed and NAME.pub
  worker version                           print the version

Run "worker COMMAND -h" for a command's flags.
Environment: NATS_URL, DOCKER_HOST, OTEL_* mean what they always mean.
`

// run dispatches a subcommand. Only main picks the exit code.
func run(ctx context.Context, args []string, getenv func(string) string, stdin io.Reader, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return &exitError{code: 2}
	}
	switch args[0] {
	case "serve":
		return serve(ctx, args[1:], getenv, stderr)
	case "submit":
		return submit(ctx, args[1:], getenv, stdin, stdout, stderr)
	case "mcp":
		return mcpCommand(ctx, args[1:], getenv, stdin, stdout, stderr)
	case "build":
		return build(ctx, args[1:], stderr)
	case "proxy":
		err := proxy.Main(ctx, args[1:], getenv, stderr)
		switch {
		case errors.Is(err, flag.ErrHelp):
			return nil
		case errors.Is(err, proxy.ErrInvalidConfig):
			return usageError("%v", err)
		}
		return err
	case "nats-auth":
		return natsAuthConfig(args[1:], stdout, stderr)
	case "nkey":
		return nkeyCommand(args[1:], stdout, stderr)
	case "version", "--version":
		fmt.Fprintln(stdout, "jazzmine worker", version)
		return nil
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage)
		return nil
	default:
		fmt.Fprint(stderr, usage)
		return usageError("unknown command %q", args[0])
	}
}
