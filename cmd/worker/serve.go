package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"

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
	metricsAddr := fs.String("metrics-addr", "127.0.0.1:9464", "address of /metrics, /healthz and /readyz (empty: none)")
	auth := addNATSAuthFlags(fs, getenv)
	if err := fs.Parse(args); err != nil {
		return &exitError{code: 2, err: nil}
	}
	natsOpts, err := auth.options()
	if err != nil {
		return usageError("%v", err)
	}
	if getenv("NATS_URL") == "" && auth.set() {
		return usageError("NATS credentials and TLS options (--creds, --nkey, --tls-*, NATS_CREDS, ...) need NATS_URL: the embedded server runs without them, on loopback")
	}
	log, err := newLogger(stderr, *logFormat, *logLevel)
	if err != nil {
		return usageError("%v", err)
	}
	slog.SetDefault(log)
	tel, err := worker.SetupTelemetry(ctx, getenv)
	if err != nil {
		return err
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := tel.Shutdown(sctx); err != nil {
			log.Warn("flush telemetry", "err", err)
		}
	}()
	var health worker.Health
	warm := make(chan struct{})
	health.Check("pools", func() error {
		select {
		case <-warm:
			return nil
		default:
			return errors.New("warming up")
		}
	})
	if *metricsAddr != "" {
		stop, err := serveHTTP(*metricsAddr, health.Handler(tel.Metrics), log)
		if err != nil {
			return err
		}
		defer stop()
	}

	cfg, err := imagebuild.LoadConfig(*configPath)
	if err != nil {
		return usageError("config: %v", err)
	}
	settings, err := worker.ParseSettings(cfg.Worker)
	if err != nil {
		return usageError("config %s: %v", *configPath, err)
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
	bctx, span := otel.Tracer("github.com/jazzmine/worker/cmd/worker").Start(ctx, "build images")
	images, err := builder.EnsureAll(bctx, cfg)
	builds, _ := otel.Meter("github.com/jazzmine/worker/cmd/worker").Int64Counter("jazzmine.image.builds",
		metric.WithUnit("{image}"), metric.WithDescription("Sandbox images built (an unchanged checksum builds nothing)"))
	for name, img := range images {
		if img.Built {
			builds.Add(ctx, 1, metric.WithAttributes(attribute.String("sandbox", name)))
		}
	}
	if err != nil {
		span.SetStatus(codes.Error, err.Error())
		span.End()
		return err
	}
	span.End()

	nc, shutdownNATS, err := connectNATS(ctx, getenv("NATS_URL"), natsOpts, *listen, *storeDir, log)
	if err != nil {
		return err
	}
	defer shutdownNATS()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	health.Check("nats", func() error {
		if !nc.IsConnected() {
			return fmt.Errorf("disconnected (%s)", nc.Status())
		}
		return nil
	})

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
		ReapGrace:   settings.ReapGrace,
		Logger:      log,
	}
	wcfg := worker.Config{NATS: nc, WorkerID: id, Logger: log}
	for _, name := range cfg.Names() {
		sb := worker.PoolSandbox(cfg.Sandboxes[name], images[name])
		poolCfg.Sandboxes = append(poolCfg.Sandboxes, sb)
		wcfg.Sandboxes = append(wcfg.Sandboxes, worker.WorkerSandbox(sb))
	}
	if err := setUpEgress(ctx, docker, builder, cfg, poolCfg.Sandboxes, log); err != nil {
		return err
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
	if err := startWorker(ctx, w, log); err != nil {
		closePool(pool, log)
		return err
	}
	if err := pool.Start(ctx); err != nil {
		log.Warn("some warm containers did not start; the pool keeps trying", "err", err)
	}
	close(warm)
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

// startWorker starts w, trying again for as long as JetStream is not ready. A cluster
// whose nodes have just started, or that has just lost a node, answers stream,
// consumer and bucket requests with timeouts or 503s until its leaders are elected
// (seconds); a fleet started together with its cluster would otherwise exit and wait
// for a supervisor to restart it. Workers that create the same replicated stream at
// once get no answer at all, although the stream is made (nats-server issues 3677 and
// 8350): each try is bounded, 2 s at first, the next finds the stream made, and the
// delays between tries are random, so that workers started together stop creating the
// next stream or bucket at the same moment. Any other error (a config the server
// refuses) ends the start at once, as does ctx.
func startWorker(ctx context.Context, w *worker.Worker, log *slog.Logger) error {
	delay, limit := 500*time.Millisecond, 2*time.Second
	for {
		tctx, cancel := context.WithTimeout(ctx, limit)
		err := w.Start(tctx)
		cancel()
		if err == nil || !jetStreamNotReady(err) || ctx.Err() != nil {
			return err
		}
		wait := delay/2 + rand.N(delay) // from half the delay to one and a half
		log.Warn("JetStream is not ready; trying again", "err", err, "in", wait)
		select {
		case <-time.After(wait):
		case <-ctx.Done():
			return err
		}
		delay, limit = min(2*delay, 5*time.Second), min(limit*3/2, 30*time.Second)
	}
}

// jetStreamNotReady reports whether err is how JetStream answers while it cannot serve
// yet: a request that timed out or found no responder, or a 503 (no meta leader, or
// an asset's group still electing its leader).
func jetStreamNotReady(err error) bool {
	var apiErr *jetstream.APIError
	switch {
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, nats.ErrTimeout), errors.Is(err, nats.ErrNoResponders):
		return true
	case errors.As(err, &apiErr):
		return apiErr.Code == http.StatusServiceUnavailable
	}
	return false
}

func closePool(pool *sandboxpool.Pool, log *slog.Logger) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := pool.Close(ctx); err != nil {
		log.Warn("close the pool", "err", err)
	}
}

// connectNATS connects to url with the options auth (credentials, TLS), or, when url
// is empty, starts the embedded server and connects to it without them.
func connectNATS(ctx context.Context, url string, auth []nats.Option, listen, storeDir string, log *slog.Logger) (*nats.Conn, func(), error) {
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
		nc, err := nats.Connect(url, append(opts, auth...)...)
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

// serveHTTP serves h on addr in the background; stop shuts it down.
func serveHTTP(addr string, h http.Handler, log *slog.Logger) (stop func(), err error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("metrics listener: %w", err)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("metrics server", "err", err)
		}
	}()
	log.Info("metrics and health", "url", "http://"+ln.Addr().String()+"/metrics")
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
		<-done
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
		return slog.New(worker.TraceHandler{Handler: slog.NewTextHandler(w, opts)}), nil
	case "json":
		return slog.New(worker.TraceHandler{Handler: slog.NewJSONHandler(w, opts)}), nil
	}
	return nil, errors.New("log format must be text or json")
}
