package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/jazzmine/worker/worker"
	"go.yaml.in/yaml/v3"
)

// Settings is the "worker" section of the config file: the NATS side of the worker.
// Every field is optional; zero means the default of the Config field it sets.
//
//	worker:
//	  replicas: 1               # streams, consumers and buckets; 3 on a 3-node cluster
//	  ack_wait: 30s             # a job without ack or heartbeat this long is redelivered
//	  heartbeat: 10s            # in-progress heartbeat of a running job
//	  max_deliver: 3            # deliveries before a job is given up
//	  nak_delay: 2s             # retry delay after an infrastructure failure
//	  events_max_age: 1h        # how long events are kept
//	  duplicate_window: 2m      # jobs with the same Nats-Msg-Id in this window run once
//	  max_backlog: 100000       # queued jobs; beyond it a publish fails
//	  max_backlog_bytes: 1073741824 # in bytes (1 GiB); sizes are plain numbers of bytes
//	  tenant_backlog: 10000     # queued jobs per tenant and sandbox (per sandbox without tenants), waiting calls per session; -1: no bound
//	  files_max_bytes: 1073741824 # the bucket JAZZMINE_FILES: inputs, artifacts, images (1 GiB)
//	  tenant_files_max_bytes: 268435456 # each tenant's bucket JAZZMINE_FILES_<tenant>: its artifacts, images (256 MiB)
//	  max_script_bytes: 262144
//	  shutdown_grace: 30s       # on SIGTERM, how long running jobs may finish
//	  liveness_ttl: 15s         # a worker silent this long counts as dead
//	  unserved_grace: 10m       # a sandbox no live worker serves this long leaves the streams:
//	                            # its jobs are refused at publish, and those it held end
//	  reap_interval: 30s        # how often dead workers' containers are looked for
//	  reap_min_age: 1m          # containers younger than this are never reaped
//	  reap_grace: 2m            # a worker must seem dead this long before its containers are
//	  max_ack_pending: {}       # per sandbox: the fleet's jobs in flight (default: its slots)
//	  max_sessions: 16          # sessions this worker holds at once
//	  sandbox_sessions: {}      # per sandbox: sessions this worker holds at once (default 4)
//	  tenant_sessions: {}       # per sandbox: sessions of one tenant this worker holds at once
//	                            # (default: half of its sandbox_sessions, at least 1); and a
//	                            # tenant holds at most half of max_sessions in all
//	  session_idle_ttl: 10m     # a session idle this long ends
//	  session_max_life: 1h      # a session this old ends
//	  shared_uid: false         # every sandbox container as uid 10001: for a Docker daemon in a
//	                            # user namespace of its own (LXC, Sysbox), where a uid from 2^30
//	                            # has no mapping (userns-remap and rootless are seen by themselves)
//	  require_gvisor: ""        # "tenants": a sandbox without runtime: runsc serves the fleet's own
//	                            # account only (a tenant's job of it ends with invalid_job); "all":
//	                            # serve refuses to start with such a sandbox. Set, the engine must
//	                            # have runsc (make gvisor), or serve refuses to start
type Settings struct {
	Replicas        int            `yaml:"replicas"`
	AckWait         time.Duration  `yaml:"ack_wait"`
	Heartbeat       time.Duration  `yaml:"heartbeat"`
	MaxDeliver      int            `yaml:"max_deliver"`
	NakDelay        time.Duration  `yaml:"nak_delay"`
	EventsMaxAge    time.Duration  `yaml:"events_max_age"`
	DuplicateWindow time.Duration  `yaml:"duplicate_window"`
	MaxBacklog      int64          `yaml:"max_backlog"`
	MaxBacklogBytes int64          `yaml:"max_backlog_bytes"`
	TenantBacklog   int64          `yaml:"tenant_backlog"`
	FilesMaxBytes   int64          `yaml:"files_max_bytes"`
	TenantFiles     int64          `yaml:"tenant_files_max_bytes"`
	MaxScriptBytes  int            `yaml:"max_script_bytes"`
	ShutdownGrace   time.Duration  `yaml:"shutdown_grace"`
	LivenessTTL     time.Duration  `yaml:"liveness_ttl"`
	UnservedGrace   time.Duration  `yaml:"unserved_grace"`
	ReapInterval    time.Duration  `yaml:"reap_interval"`
	ReapMinAge      time.Duration  `yaml:"reap_min_age"`
	ReapGrace       time.Duration  `yaml:"reap_grace"`
	MaxAckPending   map[string]int `yaml:"max_ack_pending"`
	MaxSessions     int            `yaml:"max_sessions"`
	SandboxSessions map[string]int `yaml:"sandbox_sessions"`
	TenantSessions  map[string]int `yaml:"tenant_sessions"`
	SharedUID       bool           `yaml:"shared_uid"`
	RequireGVisor   string         `yaml:"require_gvisor"`
	SessionIdleTTL  time.Duration  `yaml:"session_idle_ttl"`
	SessionMaxLife  time.Duration  `yaml:"session_max_life"`
}

// parseSettings decodes the "worker" section (imagebuild.Config.Worker). An empty node
// gives zero Settings. Unknown fields are an error.
func parseSettings(node yaml.Node) (Settings, error) {
	var s Settings
	if node.Kind == 0 {
		return s, nil
	}
	raw, err := yaml.Marshal(&node)
	if err != nil {
		return s, fmt.Errorf("worker section: %w", err)
	}
	dec := yaml.NewDecoder(bytes.NewReader(raw))
	dec.KnownFields(true)
	if err := dec.Decode(&s); err != nil && !errors.Is(err, io.EOF) {
		return s, fmt.Errorf("worker section (line %d): %w", node.Line, err)
	}
	for setting, m := range map[string]map[string]int{"max_ack_pending": s.MaxAckPending, "sandbox_sessions": s.SandboxSessions, "tenant_sessions": s.TenantSessions} {
		for name, n := range m {
			if n < 1 {
				return s, fmt.Errorf("worker section: %s of %q is %d, want at least 1", setting, name, n)
			}
		}
	}
	switch s.RequireGVisor {
	case requireGVisorNone, requireGVisorTenants, requireGVisorAll:
	default:
		return s, fmt.Errorf("worker section: require_gvisor is %q, want %q, %q or nothing", s.RequireGVisor, requireGVisorTenants, requireGVisorAll)
	}
	if s.MaxSessions < 0 || s.Replicas < 0 || s.MaxDeliver < 0 || s.MaxBacklog < 0 || s.MaxBacklogBytes < 0 || s.FilesMaxBytes < 0 || s.TenantFiles < 0 || s.MaxScriptBytes < 0 {
		return s, errors.New("worker section: counts must not be negative")
	}
	return s, nil
}

// Apply copies the settings into cfg where they are set.
func (s Settings) Apply(cfg *worker.Config) {
	set := func(dst *time.Duration, v time.Duration) {
		if v != 0 {
			*dst = v
		}
	}
	set(&cfg.AckWait, s.AckWait)
	set(&cfg.Heartbeat, s.Heartbeat)
	set(&cfg.NakDelay, s.NakDelay)
	set(&cfg.EventsMaxAge, s.EventsMaxAge)
	set(&cfg.DuplicateWindow, s.DuplicateWindow)
	set(&cfg.LivenessTTL, s.LivenessTTL)
	set(&cfg.UnservedGrace, s.UnservedGrace)
	set(&cfg.SessionIdleTTL, s.SessionIdleTTL)
	set(&cfg.SessionMaxLife, s.SessionMaxLife)
	if s.MaxSessions != 0 {
		cfg.MaxSessions = s.MaxSessions
	}
	if s.Replicas != 0 {
		cfg.Replicas = s.Replicas
	}
	if s.MaxDeliver != 0 {
		cfg.MaxDeliver = s.MaxDeliver
	}
	if s.MaxBacklog != 0 {
		cfg.MaxBacklog = s.MaxBacklog
	}
	if s.TenantBacklog != 0 {
		cfg.TenantBacklog = s.TenantBacklog
	}
	if s.FilesMaxBytes != 0 {
		cfg.FilesMaxBytes = s.FilesMaxBytes
	}
	if s.TenantFiles != 0 {
		cfg.TenantFilesMaxBytes = s.TenantFiles
	}
	if s.MaxBacklogBytes != 0 {
		cfg.MaxBacklogBytes = s.MaxBacklogBytes
	}
	if s.MaxScriptBytes != 0 {
		cfg.MaxScriptBytes = s.MaxScriptBytes
	}
	for i := range cfg.Sandboxes {
		if n := s.MaxAckPending[cfg.Sandboxes[i].Name]; n > 0 {
			cfg.Sandboxes[i].MaxAckPending = n
		}
		if n := s.SandboxSessions[cfg.Sandboxes[i].Name]; n > 0 {
			cfg.Sandboxes[i].MaxSessions = n
		}
		if n := s.TenantSessions[cfg.Sandboxes[i].Name]; n > 0 {
			cfg.Sandboxes[i].TenantSessions = n
		}
	}
}
