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
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/moby/moby/client"

	"github.com/jazzmine/worker/imagebuild"
	"github.com/jazzmine/worker/internal/sandboxspec"
	"github.com/jazzmine/worker/sandboxpool"
	"github.com/jazzmine/worker/worker"
)

// serveFlags are the command line of `worker serve`.
type serveFlags struct {
	configPath, listen, storeDir, workerID, logFormat, logLevel, metricsAddr string
	natsOpts                                                                 []nats.Option
	ignored                                                                  []string // flags of the embedded server given with NATS_URL set
}

func parseServeFlags(args []string, getenv func(string) string, stderr io.Writer) (*serveFlags, error) {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(stderr)
	f := &serveFlags{}
	fs.StringVar(&f.configPath, "config", "config.yaml", "the sandboxes and worker settings (YAML)")
	fs.StringVar(&f.listen, "nats-listen", defaultEmbeddedAddr, "address of the embedded NATS server, which runs when NATS_URL is unset (env NATS_URL: the NATS server or cluster to use instead)")
	fs.StringVar(&f.storeDir, "store-dir", defaultStoreDir(getenv), "JetStream data directory of the embedded NATS server")
	fs.StringVar(&f.workerID, "worker-id", "", "this worker's id (default: host name, pid and a random suffix)")
	fs.StringVar(&f.logFormat, "log-format", "text", "log format: text or json")
	fs.StringVar(&f.logLevel, "log-level", "info", "log level: debug, info, warn or error")
	fs.StringVar(&f.metricsAddr, "metrics-addr", "127.0.0.1:9464", "address of /metrics, /healthz and /readyz (empty: none)")
	auth := addNATSAuthFlags(fs, getenv)
	if err := fs.Parse(args); err != nil {
		return nil, &exitError{code: 2, err: nil}
	}
	var err error
	if f.natsOpts, err = auth.options(); err != nil {
		return nil, usageError("%v", err)
	}
	if getenv("NATS_URL") != "" {
		fs.Visit(func(fl *flag.Flag) {
			if fl.Name == "nats-listen" || fl.Name == "store-dir" {
				f.ignored = append(f.ignored, "--"+fl.Name)
			}
		})
	}
	if getenv("NATS_URL") == "" && auth.set() {
		return nil, usageError("NATS credentials and TLS options (--creds, --nkey, --tls-*, NATS_CREDS, ...) need NATS_URL: the embedded server runs without them, on loopback")
	}
	if f.workerID == "" {
		f.workerID = worker.NewWorkerID()
	}
	return f, nil
}

func serve(ctx context.Context, args []string, getenv func(string) string, stderr io.Writer) error {
	f, err := parseServeFlags(args, getenv, stderr)
	if err != nil {
		return err
	}
	log, err := newLogger(stderr, f.logFormat, f.logLevel)
	if err != nil {
		return usageError("%v", err)
	}
	slog.SetDefault(log)
	if len(f.ignored) > 0 {
		log.Warn("NATS_URL is set: the worker connects to it and starts no embedded server, so these flags are ignored", "nats_url", getenv("NATS_URL"), "ignored", f.ignored)
	}
	tel, err := setupTelemetry(ctx, getenv)
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
	var health Health
	// Not ready until every sandbox serves (sandboxStates.ready); the pool comes later.
	states := &sandboxStates{}
	var pool atomic.Pointer[sandboxpool.Pool]
	health.Check("sandboxes", func() error { return states.ready(pool.Load()) })
	if f.metricsAddr != "" {
		stop, err := serveHTTP(f.metricsAddr, health.Handler(tel.Metrics), log)
		if err != nil {
			return err
		}
		defer stop()
	}

	cfg, err := imagebuild.LoadConfig(f.configPath)
	if err != nil {
		return usageError("%v", err)
	}
	settings, err := parseSettings(cfg.Worker)
	if err != nil {
		return usageError("config %s: %v", f.configPath, err)
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

	// NATS first, before any image is built: agents connect and submit meanwhile, and
	// their jobs wait in the stream until their sandbox serves. A connection the client
	// closed for good (the server refused a protocol line of ours, a reconnect cannot
	// help) ends the worker: its containers are removed and it exits non-zero for its
	// supervisor to start it again, where it went on holding them, serving nothing.
	ctx, lost := context.WithCancelCause(ctx)
	defer lost(nil)
	nc, shutdownNATS, err := connectNATS(ctx, getenv("NATS_URL"), f.natsOpts, f.listen, f.storeDir, log, func(c *nats.Conn) {
		lost(fmt.Errorf("the NATS connection closed for good: %v", c.LastError()))
	})
	if err != nil {
		return err
	}
	defer shutdownNATS()
	health.Check("nats", func() error {
		if !nc.IsConnected() {
			return fmt.Errorf("disconnected (%s)", nc.Status())
		}
		return nil
	})
	states.init(cfg.Names())
	m := member{id: f.workerID, nc: nc, docker: docker, builder: builder, cfg: cfg, settings: settings, log: log.With("worker_id", f.workerID)}
	err = m.run(ctx, states, &pool)
	if cause := context.Cause(ctx); cause != nil && !errors.Is(cause, context.Canceled) {
		log.Error("stopped", "err", cause)
		return errors.Join(cause, err)
	}
	return err
}

// member is a worker of the fleet with its pool, from its start to its shutdown.
type member struct {
	id       string
	nc       *nats.Conn
	docker   *client.Client
	builder  *imagebuild.Builder
	cfg      *imagebuild.Config
	settings Settings
	log      *slog.Logger
}

// run starts the worker and the pool with every sandbox pending, then builds the
// sandboxes' images at once, each sandbox serving as soon as its image is ready and
// its warm containers started (bring); one that cannot be built is reported and the
// others serve. It serves until ctx ends; then it shuts the worker down within the
// grace and closes the pool. states follow the sandboxes, and the pool is stored in
// started once made.
func (m *member) run(ctx context.Context, states *sandboxStates, started *atomic.Pointer[sandboxpool.Pool]) error {
	js, err := jetstream.New(m.nc)
	if err != nil {
		return err
	}
	poolCfg := sandboxpool.Config{
		Docker:       m.docker,
		WorkerID:     m.id,
		Secrets:      m.cfg.Secrets,
		HostPathMap:  m.cfg.HostPathMap,
		WorkerAlive:  worker.WorkerAlive(js),
		ReapInterval: m.settings.ReapInterval,
		ReapMinAge:   m.settings.ReapMinAge,
		ReapGrace:    m.settings.ReapGrace,
		Logger:       m.log,
	}
	wcfg := worker.Config{NATS: m.nc, WorkerID: m.id, Logger: m.log}
	var pending []sandboxpool.Sandbox // the pool's sandboxes, their images not known yet
	for _, name := range m.cfg.Names() {
		sb := sandboxspec.Pool(m.cfg.Sandboxes[name], imagebuild.Image{})
		pending = append(pending, sb)
		ws := sandboxspec.Worker(sb, m.cfg.Sandboxes[name])
		ws.Pending = true
		wcfg.Sandboxes = append(wcfg.Sandboxes, ws)
	}
	sandboxspec.NetworkHint(pending, m.cfg)
	if err := isolate(ctx, m.docker, m.settings.RequireGVisor, pending, wcfg.Sandboxes); err != nil {
		return err
	}
	if err := setUpEgress(ctx, m.docker, m.builder, m.cfg, pending, m.log); err != nil {
		return err
	}
	remaps, err := sandboxpool.RemapsUIDs(ctx, m.docker)
	if err != nil {
		return err
	}
	if poolCfg.SharedUID = remaps || m.settings.SharedUID; poolCfg.SharedUID {
		m.log.Warn("every sandbox container runs as uid 10001, and shares the kernel's per-uid counters with the others: the engine remaps containers' uids (userns-remap, rootless), or worker.shared_uid is set")
	}
	pool, err := sandboxpool.New(poolCfg)
	if err != nil {
		return err
	}
	wcfg.Pool = pool
	m.settings.Apply(&wcfg)
	w, err := worker.New(wcfg)
	if err != nil {
		return err
	}
	// The worker announces itself before the pool spawns, so that no other worker's
	// reaper takes the new containers for orphans.
	if err := startWorker(ctx, w, m.log); err != nil {
		closePool(pool, m.log)
		return err
	}
	if err := pool.Start(ctx); err != nil {
		m.log.Warn("start the pool", "err", err)
	}
	started.Store(pool)
	var brought, settled sync.WaitGroup // settled: each sandbox served, or failed once
	for _, sb := range pending {
		brought.Add(1)
		settled.Add(1)
		go func() {
			defer brought.Done()
			m.bring(ctx, sb, pool, w, states, sync.OnceFunc(settled.Done))
		}()
	}
	go func() {
		settled.Wait()
		if failed := states.failed(); len(failed) > 0 {
			m.log.Error("serving some sandboxes only: the others could not be built", "sandboxes", states.serving(), "failed", failed, "nats", m.nc.ConnectedUrlRedacted())
		} else if ctx.Err() == nil {
			m.log.Info("serving", "sandboxes", states.serving(), "nats", m.nc.ConnectedUrlRedacted())
		}
	}()

	<-ctx.Done()
	grace := m.settings.ShutdownGrace
	if grace == 0 {
		grace = worker.DefaultShutdownGrace
	}
	m.log.Info("shutting down", "grace", grace)
	sctx, cancel := context.WithTimeout(context.Background(), grace+30*time.Second)
	defer cancel()
	err = w.Shutdown(sctx, grace)
	brought.Wait() // their builds gave up with ctx
	closePool(pool, m.log)
	return err
}

// The delays between two builds of a sandbox whose image could not be built: the
// first doubles up to the last. A mirror that did not answer, or a base image loaded
// meanwhile, needs no restart of the worker.
const (
	buildRetryMin = 30 * time.Second
	buildRetryMax = 10 * time.Minute
)

// bring builds the image of a pending sandbox (traced and counted), adds the sandbox
// to the pool and has the worker serve it. While its image cannot be built, the
// sandbox is reported to the log, the catalog and states, and built again after a
// delay. settled is called once: when it serves, or when it first failed. Warm
// containers that did not start are logged: the pool keeps trying, as for any
// sandbox.
func (m *member) bring(ctx context.Context, sb sandboxpool.Sandbox, pool *sandboxpool.Pool, w *worker.Worker, states *sandboxStates, settled func()) {
	defer settled()
	log := m.log.With("sandbox", sb.Name)
	var img imagebuild.Image
	for delay := buildRetryMin; ; delay = min(2*delay, buildRetryMax) {
		var err error
		if img, err = buildImage(ctx, m.builder, m.cfg.Sandboxes[sb.Name]); err == nil {
			break
		}
		if ctx.Err() != nil {
			return
		}
		log.Error("the sandbox is not served: its image could not be built", "err", err, "again_in", delay)
		states.set(sb.Name, fmt.Sprintf("failed (built again in %v): %v", delay, err))
		w.Unavailable(sb.Name, err)
		settled()
		select {
		case <-time.After(delay):
		case <-ctx.Done():
			return
		}
		states.set(sb.Name, stateBuilding)
	}
	sb.Image, sb.Checksum = img.Tag, img.Checksum
	states.set(sb.Name, stateStarting)
	if err := pool.Add(ctx, sb); err != nil {
		if _, added := pool.Stats().Sandboxes[sb.Name]; !added {
			log.Error("the sandbox is not served: the pool refused it", "err", err)
			states.set(sb.Name, "failed: "+err.Error())
			w.Unavailable(sb.Name, err)
			return
		}
		if ctx.Err() != nil {
			return
		}
		log.Warn("some warm containers did not start; the pool keeps trying", "err", err)
	}
	if err := w.Serve(sb.Name); err != nil {
		log.Error("serve the sandbox", "err", err)
		return
	}
	states.set(sb.Name, stateServing)
}

// buildImage makes sure a sandbox's image is built, traced and counted.
func buildImage(ctx context.Context, builder *imagebuild.Builder, spec *imagebuild.Spec) (imagebuild.Image, error) {
	bctx, span := otel.Tracer("github.com/jazzmine/worker/cmd/worker").Start(ctx, "build image",
		trace.WithAttributes(attribute.String("sandbox", spec.Name)))
	defer span.End()
	img, err := builder.Ensure(bctx, spec)
	if err != nil {
		span.SetStatus(codes.Error, err.Error())
		return img, err
	}
	if img.Built {
		builds, _ := otel.Meter("github.com/jazzmine/worker/cmd/worker").Int64Counter("jazzmine.image.builds",
			metric.WithUnit("{image}"), metric.WithDescription("Sandbox images built (an unchanged checksum builds nothing)"))
		builds.Add(ctx, 1, metric.WithAttributes(attribute.String("sandbox", spec.Name)))
	}
	return img, nil
}

// The states of a sandbox on its way to serving; a failed one's state is "failed: "
// and why.
const (
	stateBuilding = "building its image"
	stateStarting = "starting its warm containers"
	stateServing  = "serving"
)

// sandboxStates are where each sandbox of the config is on its way to serving, for
// /readyz and the log.
type sandboxStates struct {
	mu    sync.Mutex // guards state
	names []string
	state map[string]string
}

// init names the config's sandboxes, all building.
func (s *sandboxStates) init(names []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.names, s.state = names, map[string]string{}
	for _, n := range names {
		s.state[n] = stateBuilding
	}
}

func (s *sandboxStates) set(name, state string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.state[name] = state
}

// with returns the names of the sandboxes whose state keep says.
func (s *sandboxStates) with(keep func(string) bool) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var names []string
	for _, n := range s.names {
		if keep(s.state[n]) {
			names = append(names, n)
		}
	}
	return names
}

func (s *sandboxStates) serving() []string {
	return s.with(func(st string) bool { return st == stateServing })
}

func (s *sandboxStates) failed() []string {
	return s.with(func(st string) bool { return strings.HasPrefix(st, "failed") })
}

// ready is nil once every sandbox serves with a ready container of the pool whose
// tools all loaded (one without warm containers, once it serves); else it names
// each sandbox that does not, and why.
func (s *sandboxStates) ready(pool *sandboxpool.Pool) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.names == nil || pool == nil {
		return errors.New("starting")
	}
	var errs []error
	for _, n := range s.names {
		st := s.state[n]
		if st != stateServing {
			errs = append(errs, fmt.Errorf("%s: %s", n, st))
			continue
		}
		r, ok := pool.Ready(n)
		if !ok {
			// A sandbox with no warm containers (pool.size 0) has none until a job.
			if pool.Stats().Sandboxes[n].PoolSize > 0 {
				errs = append(errs, fmt.Errorf("%s: no container ready yet", n))
			}
			continue
		}
		for _, e := range r.ToolErrors {
			errs = append(errs, fmt.Errorf("%s: tool %s failed to load: %s", n, e.File, e.Error))
		}
	}
	return errors.Join(errs...)
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
		if err == nil || !worker.Transient(err) || ctx.Err() != nil {
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

func closePool(pool *sandboxpool.Pool, log *slog.Logger) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := pool.Close(ctx); err != nil {
		log.Warn("close the pool", "err", err)
	}
}

// connectNATS connects to url with the options auth (credentials, TLS), or, when url
// is empty, starts the embedded server and connects to it without them; closed is
// called when the connection is closed, by its drain at the end or for good.
func connectNATS(ctx context.Context, url string, auth []nats.Option, listen, storeDir string, log *slog.Logger, closed nats.ConnHandler) (*nats.Conn, func(), error) {
	opts := []nats.Option{
		nats.Name("jazzmine-worker"),
		nats.MaxReconnects(-1),
		nats.ClosedHandler(closed),
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
	srv, err := startEmbedded(embeddedConfig{Addr: listen, StoreDir: storeDir})
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
		return slog.New(traceHandler{Handler: slog.NewTextHandler(w, opts)}), nil
	case "json":
		return slog.New(traceHandler{Handler: slog.NewJSONHandler(w, opts)}), nil
	}
	return nil, errors.New("log format must be text or json")
}
