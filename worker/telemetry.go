package worker

import (
	"context"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/jazzmine/worker/sandboxpool"
)

// instrumentation is the name of the tracer and meter of this package.
const instrumentation = "github.com/jazzmine/worker/worker"

// telemetry holds the worker's tracer and instruments.
type telemetry struct {
	tracer trace.Tracer
	prop   propagation.TextMapPropagator

	checkoutWait metric.Float64Histogram
	execDuration metric.Float64Histogram
	outputBytes  metric.Int64Histogram
	jobs         metric.Int64Counter
	redeliveries metric.Int64Counter
	reg          metric.Registration
}

func newTelemetry(cfg *Config) (*telemetry, error) {
	tp, mp, prop := cfg.TracerProvider, cfg.MeterProvider, cfg.Propagator
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	if prop == nil {
		prop = otel.GetTextMapPropagator()
	}
	m := mp.Meter(instrumentation)
	t := &telemetry{tracer: tp.Tracer(instrumentation), prop: prop}
	var err error
	seconds := metric.WithExplicitBucketBoundaries(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
	if t.checkoutWait, err = m.Float64Histogram("jazzmine.checkout.wait", metric.WithUnit("s"), seconds,
		metric.WithDescription("Time a job waited for a container")); err != nil {
		return nil, err
	}
	if t.execDuration, err = m.Float64Histogram("jazzmine.execution.duration", metric.WithUnit("s"), seconds,
		metric.WithDescription("Duration of executions, by sandbox and outcome")); err != nil {
		return nil, err
	}
	if t.outputBytes, err = m.Int64Histogram("jazzmine.execution.output", metric.WithUnit("By"),
		metric.WithExplicitBucketBoundaries(256, 1<<10, 4<<10, 16<<10, 64<<10, 256<<10, 1<<20, 4<<20),
		metric.WithDescription("Bytes of an execution's event stream")); err != nil {
		return nil, err
	}
	if t.jobs, err = m.Int64Counter("jazzmine.jobs", metric.WithUnit("{job}"),
		metric.WithDescription("Job deliveries handled, by sandbox, outcome and action (ack, nak, term)")); err != nil {
		return nil, err
	}
	if t.redeliveries, err = m.Int64Counter("jazzmine.redeliveries", metric.WithUnit("{job}"),
		metric.WithDescription("Deliveries of a job after its first")); err != nil {
		return nil, err
	}
	if cfg.Pool != nil {
		if t.reg, err = registerPoolMetrics(m, cfg.Pool); err != nil {
			return nil, err
		}
	}
	return t, nil
}

// registerPoolMetrics observes the pool's Stats: gauges of containers by state and
// capacity, and counters of containers spawned and retired by reason.
func registerPoolMetrics(m metric.Meter, pool *sandboxpool.Pool) (metric.Registration, error) {
	containers, err := m.Int64ObservableGauge("jazzmine.pool.containers", metric.WithUnit("{container}"),
		metric.WithDescription("Containers of a sandbox by state: idle, in_use, starting, busy (resetting or health-checking)"))
	if err != nil {
		return nil, err
	}
	capacity, err := m.Int64ObservableGauge("jazzmine.pool.capacity", metric.WithUnit("{container}"),
		metric.WithDescription("Most containers a sandbox may have (pool size plus overflow)"))
	if err != nil {
		return nil, err
	}
	waiting, err := m.Int64ObservableGauge("jazzmine.pool.waiting", metric.WithUnit("{job}"),
		metric.WithDescription("Jobs waiting for a container"))
	if err != nil {
		return nil, err
	}
	spawned, err := m.Int64ObservableCounter("jazzmine.pool.spawned", metric.WithUnit("{container}"),
		metric.WithDescription("Containers started and ready"))
	if err != nil {
		return nil, err
	}
	spawnFailures, err := m.Int64ObservableCounter("jazzmine.pool.spawn_failures", metric.WithUnit("{container}"),
		metric.WithDescription("Containers that failed to start"))
	if err != nil {
		return nil, err
	}
	retired, err := m.Int64ObservableCounter("jazzmine.pool.retired", metric.WithUnit("{container}"),
		metric.WithDescription("Containers removed, by reason"))
	if err != nil {
		return nil, err
	}
	return m.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		for name, s := range pool.Stats().Sandboxes {
			sb := attribute.String("sandbox", name)
			for state, n := range map[string]int{"idle": s.Idle, "in_use": s.InUse, "starting": s.Starting, "busy": s.Busy} {
				o.ObserveInt64(containers, int64(n), metric.WithAttributes(sb, attribute.String("state", state)))
			}
			o.ObserveInt64(capacity, int64(s.Capacity), metric.WithAttributes(sb))
			o.ObserveInt64(waiting, int64(s.Waiting), metric.WithAttributes(sb))
			o.ObserveInt64(spawned, int64(s.Spawned), metric.WithAttributes(sb))
			o.ObserveInt64(spawnFailures, int64(s.SpawnFailures), metric.WithAttributes(sb))
			for reason, n := range s.Retired {
				o.ObserveInt64(retired, int64(n), metric.WithAttributes(sb, attribute.String("reason", reason)))
			}
		}
		return nil
	}, containers, capacity, waiting, spawned, spawnFailures, retired)
}

func seconds(d time.Duration) float64 { return d.Seconds() }

// unregister drops the callback of the observable instruments.
func (t *telemetry) unregister() {
	if t.reg != nil {
		_ = t.reg.Unregister()
	}
}
