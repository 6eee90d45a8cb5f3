package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jazzmine/worker/imagebuild"
	"github.com/jazzmine/worker/sandboxpool"
	"github.com/jazzmine/worker/worker"
)

func serve(ctx context.Context, args []string, getenv func(string) string, stderr io.Writer) error {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(stderr)
	configPath := fs.String("config", "config.yaml", "the sandboxes and worker settings (YAML)")
	listen := fs.String("nats-listen", worker.DefaultEmbeddedAddr, "address of the embedded NATS server (when NATS_URL is unset)")
	storeDir := fs.String("store-dir", defaultStoreDir(getenv), "JetStream data directory of the embedded NATS server")
	workerID := fs.String("worker-id", "", "this worker's id (default: host name, pid and a random suffix)")
	logFormat := fs.String("log-format", "text", "log format: text or json")
	logLevel := fs.String("log-level", "info", "log level: debug, info, warn or error")
	if err := fs.Parse(args); err != nil {
		return &exitError{code: 2, err: nil}
	}
	log, err := newLogger(stderr, *logFormat, *logLevel)
	if err != nil {
		return usageError("%v", err)
	}
	slog.SetDefault(log)

	cfg, err := imagebuild.LoadConfig(*configPath)
	if err != nil {
		return usageError("config: %v", err)
	}
	settings, err := worker.ParseSettings(cfg.Worker)
	if err != nil {
		return usageError("config %s: %v", *configPath, err)
	}
	for _, name := range cfg.Names() {
		if len(cfg.Sandboxes[name].Network.AllowedHosts) > 0 {
			log.Warn("network allowlists are not enforced yet: this sandbox gets no network at all", "sandbox", name)
		}
	}

	docker, err := imagebuild.Connect(ctx)
	if err != nil {
		return err
	}
	defer docker.Close()
	builder, err := imagebuild.NewBuilder(imagebuild.BuilderConfig{Docker: docker, Logger: log, Progress: stderr})
	if err != nil {
		return err
	}
	images, err := builder.EnsureAll(ctx, cfg)
	if err != nil {
		return err
	}

	nc, shutdownNATS, err := connectNATS(ctx, getenv("NATS_URL"), *listen, *storeDir, log)
	if err != nil {
		return err
	}
	defer shutdownNATS()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}

	id := *workerID
	if id == "" {
		id = worker.NewWorkerID()
	}
	log = log.With("worker_id", id)
	poolCfg := sandboxpool.Config{
		Docker:      docker,
		WorkerID:    id,
		Secrets:     cfg.Secrets,
		HostPathMap: cfg.HostPathMap,
		WorkerAlive: worker.WorkerAlive(js),
		ReapMinAge:  settings.ReapMinAge,
		Logger:      log,
	}
	wcfg := worker.Config{NATS: nc, WorkerID: id, Logger: log}
	for _, name := range cfg.Names() {
		sb := worker.PoolSandbox(cfg.Sandboxes[name], images[name])
		poolCfg.Sandboxes = append(poolCfg.Sandboxes, sb)
		wcfg.Sandboxes = append(wcfg.Sandboxes, worker.WorkerSandbox(sb))
	}
	pool, err := sandboxpool.New(poolCfg)
	if err != nil {
		return err
	}
	wcfg.Pool = pool
	settings.Apply(&wcfg)
	w, err := worker.New(wcfg)
	if err != nil {
		return err
	}
	// The worker announces itself before the pool spawns, so that no other worker's
	// reaper takes the new containers for orphans.
	if err := w.Start(ctx); err != nil {
		closePool(pool, log)
		return err
	}
	if err := pool.Start(ctx); err != nil {
		log.Warn("some warm containers did not start; the pool keeps trying", "err", err)
	}
	log.Info("serving", "sandboxes", cfg.Names(), "nats", nc.ConnectedUrlRedacted())

	<-ctx.Done()
	grace := settings.ShutdownGrace
	if grace == 0 {
		grace = worker.DefaultShutdownGrace
	}
	log.Info("shutting down", "grace", grace)
	sctx, cancel := context.WithTimeout(context.Background(), grace+30*time.Second)
	defer cancel()
	err = w.Shutdown(sctx, grace)
	closePool(pool, log)
	return err
}

func closePool(pool *sandboxpool.Pool, log *slog.Logger) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := pool.Close(ctx); err != nil {
		log.Warn("close the pool", "err", err)
	}
}

// connectNATS connects to url, or, when it is empty, starts the embedded server.
func connectNATS(ctx context.Context, url, listen, storeDir string, log *slog.Logger) (*nats.Conn, func(), error) {
	opts := []nats.Option{
		nats.Name("jazzmine-worker"),
		nats.MaxReconnects(-1),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if err != nil {
				log.Warn("NATS disconnected", "err", err)
			}
		}),
		nats.ReconnectHandler(func(c *nats.Conn) { log.Info("NATS reconnected", "url", c.ConnectedUrlRedacted()) }),
	}
	if url != "" {
		nc, err := nats.Connect(url, opts...)
		if err != nil {
			return nil, nil, fmt.Errorf("connect to NATS at %s (NATS_URL): %w", url, err)
		}
		return nc, func() { _ = nc.Drain() }, nil
	}
	if err := os.MkdirAll(storeDir, 0o700); err != nil {
		return nil, nil, fmt.Errorf("embedded NATS store: %w", err)
	}
	srv, err := worker.StartEmbedded(worker.EmbeddedConfig{Addr: listen, StoreDir: storeDir})
	if err != nil {
		return nil, nil, err
	}
	log.Info("embedded NATS server with JetStream", "url", srv.ClientURL(), "store_dir", storeDir)
	nc, err := nats.Connect(srv.ClientURL(), opts...)
	if err != nil {
		srv.Shutdown()
		return nil, nil, fmt.Errorf("connect to the embedded NATS server: %w", err)
	}
	return nc, func() {
		_ = nc.Drain()
		for !nc.IsClosed() {
			time.Sleep(10 * time.Millisecond)
		}
		srv.Shutdown()
		srv.WaitForShutdown()
	}, nil
}

func defaultStoreDir(getenv func(string) string) string {
	if d := getenv("XDG_STATE_HOME"); d != "" {
		return filepath.Join(d, "jazzmine", "nats")
	}
	if home := getenv("HOME"); home != "" {
		return filepath.Join(home, ".local", "state", "jazzmine", "nats")
	}
	return filepath.Join(os.TempDir(), "jazzmine-nats")
}

func newLogger(w io.Writer, format, level string) (*slog.Logger, error) {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("log level %q: %w", level, err)
	}
	opts := &slog.HandlerOptions{Level: lv}
	switch format {
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return nil, errors.New("log format must be text or json")
}
