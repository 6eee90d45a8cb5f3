// Package sandboxspec turns a sandbox of the config file, with its built image, into
// what the pool runs and what the worker serves: the glue of cmd/worker, shared with
// the tests that run the example config's sandboxes.
package sandboxspec

import (
	"maps"
	"strings"

	"github.com/jazzmine/worker/imagebuild"
	"github.com/jazzmine/worker/sandboxpool"
	"github.com/jazzmine/worker/wire"
	"github.com/jazzmine/worker/worker"
)

// Pool turns a sandbox of the config file, with its built image, into what the pool
// runs.
func Pool(spec *imagebuild.Spec, img imagebuild.Image) sandboxpool.Sandbox {
	env := maps.Clone(spec.Env)
	if env == nil {
		env = map[string]string{}
	}
	env["JAZZMINE_SANDBOX"] = spec.Name // named in the errors that teach (harness hints)
	sb := sandboxpool.Sandbox{
		Name:           spec.Name,
		Image:          img.Tag,
		Checksum:       img.Checksum,
		Env:            env,
		Secrets:        spec.Secrets,
		Runtime:        spec.Runtime,
		MemoryBytes:    spec.Resources.MemoryMB << 20,
		NanoCPUs:       int64(spec.Resources.CPUs * 1e9),
		PIDs:           spec.Resources.PIDs,
		WorkspaceBytes: spec.Resources.WorkspaceMB << 20,
		TmpBytes:       spec.Resources.TmpMB << 20,
		PoolSize:       spec.Pool.Size,
		MaxOverflow:    spec.Pool.MaxOverflow,
		MaxUses:        spec.Pool.MaxUses,
		MaxAge:         spec.Pool.MaxAge,
		IdleTimeout:    spec.Pool.IdleTimeout,
		ReadyTimeout:   spec.Pool.ReadyTimeout,
	}
	for _, m := range spec.Mounts {
		sb.Mounts = append(sb.Mounts, sandboxpool.Mount{Source: m.Source, Target: m.Target, ReadOnly: m.ReadOnly})
	}
	return sb
}

// Worker is what the worker needs of a pool sandbox: its slots are its capacity, its
// workspace bounds a job's input files, and what the sandbox catalog says of it (its
// limits and, from spec when it is not nil, its description, Debian and pip packages
// and allowed hosts; its tools come from its containers).
func Worker(sb sandboxpool.Sandbox, spec *imagebuild.Spec) worker.Sandbox {
	run := sb.WithDefaults()
	info := wire.SandboxInfo{
		Sandbox:     sb.Name,
		MemoryMB:    run.MemoryBytes >> 20,
		CPUs:        float64(run.NanoCPUs) / 1e9,
		WorkspaceMB: run.WorkspaceBytes >> 20,
	}
	if spec != nil {
		info.Description, info.AllowedHosts = spec.Description, spec.Network.AllowedHosts
		info.AptPackages, info.Packages = spec.AptPackages, spec.Requirements
	}
	return worker.Sandbox{Name: sb.Name, Slots: sb.PoolSize + sb.MaxOverflow, MaxInputBytes: sb.WorkspaceBytes, Info: info}
}

// NetworkHint tells the harness of each sandbox without network which sandboxes of
// cfg have some (JAZZMINE_NETWORK_SANDBOXES: "name (host, host); ..."), so that a
// script's network error can name them. sandboxes are the pool's, made by Pool.
func NetworkHint(sandboxes []sandboxpool.Sandbox, cfg *imagebuild.Config) {
	var with []string
	for _, name := range cfg.Names() {
		if hosts := cfg.Sandboxes[name].Network.AllowedHosts; len(hosts) > 0 {
			with = append(with, name+" ("+strings.Join(hosts, ", ")+")")
		}
	}
	if len(with) == 0 {
		return
	}
	for i := range sandboxes {
		if len(cfg.Sandboxes[sandboxes[i].Name].Network.AllowedHosts) == 0 {
			sandboxes[i].Env["JAZZMINE_NETWORK_SANDBOXES"] = strings.Join(with, "; ")
		}
	}
}
