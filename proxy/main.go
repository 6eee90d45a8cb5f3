package proxy

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
)

// Main runs the proxy as the `worker proxy` subcommand does: it reads the JSON
// config (see ParseConfig) from --config-json or else from the environment
// variable ConfigEnv, logs JSON lines to stderr, and serves every sandbox's
// socket (see Server.ListenAndServe) until ctx ends, when it returns nil.
// Flags: --config-json, --log-level (debug, info, warn, error; default info).
// A flag, config or listen error is returned before anything is served;
// config errors wrap ErrInvalidConfig, and -h returns flag.ErrHelp.
func Main(ctx context.Context, args []string, getenv func(string) string, stderr io.Writer) error {
	fs := flag.NewFlagSet("proxy", flag.ContinueOnError)
	fs.SetOutput(stderr)
	configJSON := fs.String("config-json", "", "the config as JSON (default: $"+ConfigEnv+")")
	logLevel := fs.String("log-level", "info", "log level: debug, info, warn or error")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("proxy: unexpected arguments %q", fs.Args())
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(*logLevel)); err != nil {
		return fmt.Errorf("proxy: --log-level: %w", err)
	}

	data := *configJSON
	if data == "" {
		data = getenv(ConfigEnv)
	}
	if data == "" {
		return errors.New("proxy: no config: set " + ConfigEnv + " or --config-json")
	}
	cfg, err := ParseConfig([]byte(data))
	if err != nil {
		return err
	}
	cfg.Logger = slog.New(slog.NewJSONHandler(stderr, &slog.HandlerOptions{Level: level}))
	srv, err := New(cfg)
	if err != nil {
		return err
	}
	return srv.ListenAndServe(ctx)
}
