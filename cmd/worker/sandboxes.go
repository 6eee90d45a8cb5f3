package main

import (
	"github.com/jazzmine/worker/imagebuild"
	"github.com/jazzmine/worker/sandboxpool"
	"github.com/jazzmine/worker/worker"
)

// poolSandbox turns a sandbox of the config file, with its built image, into what the
// pool runs.
func poolSandbox(spec *imagebuild.Spec, img imagebuild.Image) sandboxpool.Sandbox {
	sb := sandboxpool.Sandbox{
		Name:           spec.Name,
		Image:          img.Tag,
		Checksum:       img.Checksum,
		Env:            spec.Env,
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
		IdleTimeout:    spec.Pool.IdleTimeout,
		ReadyTimeout:   spec.Pool.ReadyTimeout,
	}
	for _, m := range spec.Mounts {
		sb.Mounts = append(sb.Mounts, sandboxpool.Mount{Source: m.Source, Target: m.Target, ReadOnly: m.ReadOnly})
	}
	return sb
}

// workerSandbox is what the worker needs of a pool sandbox: its slots are its capacity.
func workerSandbox(sb sandboxpool.Sandbox) worker.Sandbox {
	return worker.Sandbox{Name: sb.Name, Slots: sb.PoolSize + sb.MaxOverflow, MaxInputBytes: sb.WorkspaceBytes}
}
