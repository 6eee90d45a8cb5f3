package sandboxpool

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/moby/moby/api/pkg/stdcopy"
	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/api/types/mount"
	"github.com/moby/moby/client"

	"github.com/jazzmine/worker/harness"
)

// state is where a container is in its life.
type state int

const (
	stateIdle      state = iota // in the idle queue
	stateInUse                  // checked out
	stateReturning              // being reset after a checkout
	stateChecking               // out of the idle queue for a health check
	stateGone                   // retired: being or already removed
)

// ctr is one running container and its harness stream.
type ctr struct {
	id      string
	name    string
	sandbox *sandbox
	conn    *harness.Conn
	attach  client.HijackedResponse
	stderr  *tailBuffer
	ready   harness.Ready // what its harness said it loaded
	uid     int           // what its processes run as (takeUID)

	// Guarded by Pool.mu.
	state     state
	uses      int
	born      time.Time // when it was created: MaxAge counts from it
	retiring  bool      // on its last use; its slot already went to a replacement
	idleSince time.Time
	lastCheck time.Time
}

// shortID is the first 12 characters of the container id, as docker ps shows it.
func (c *ctr) shortID() string {
	if len(c.id) > 12 {
		return c.id[:12]
	}
	return c.id
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// takeUID returns a uid for a new container that no live container of the pool has,
// drawn at random from [SandboxUIDBase, SandboxUIDBase+SandboxUIDs), or SandboxUID
// with Config.SharedUID; giveUID gives it back when the container is removed.
func (p *Pool) takeUID() int {
	if p.cfg.SharedUID {
		return SandboxUID
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for {
		if uid := SandboxUIDBase + mrand.IntN(SandboxUIDs); !p.uids[uid] {
			p.uids[uid] = true
			return uid
		}
	}
}

// RemapsUIDs reports whether the engine maps its containers' uids into a range of its
// own, as with userns-remap or rootless Docker: there a container's uid from
// SandboxUIDBase has no mapping, and the pool needs Config.SharedUID.
func RemapsUIDs(ctx context.Context, docker interface {
	Info(context.Context, client.InfoOptions) (client.SystemInfoResult, error)
}) (bool, error) {
	res, err := docker.Info(ctx, client.InfoOptions{})
	if err != nil {
		return false, fmt.Errorf("docker info: %w", err)
	}
	for _, opt := range res.Info.SecurityOptions {
		if strings.Contains(opt, "name=userns") || strings.Contains(opt, "name=rootless") {
			return true, nil
		}
	}
	return false, nil
}

func (p *Pool) giveUID(uid int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.uids, uid)
}

// env is a container's environment: USER and LOGNAME (its uid has no passwd entry,
// and getpass.getuser() reads them), the sandbox's variables in order of name, then
// its secrets that resolve.
func (p *Pool) env(sb *Sandbox) []string {
	env := []string{"USER=" + SandboxUser, "LOGNAME=" + SandboxUser}
	keys := make([]string, 0, len(sb.Env))
	for k := range sb.Env {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		env = append(env, k+"="+sb.Env[k])
	}
	for _, s := range sb.Secrets {
		if v, ok := p.cfg.lookupSecret(s); ok {
			env = append(env, s+"="+v)
		}
	}
	return env
}

// mounts are a container's mounts: the egress volume, read-only, and the sandbox's
// bind mounts with their sources translated through HostPathMap.
func (p *Pool) mounts(sb *Sandbox) []mount.Mount {
	var mounts []mount.Mount
	if sb.EgressVolume != "" {
		mounts = append(mounts, mount.Mount{
			Type:          mount.TypeVolume,
			Source:        sb.EgressVolume,
			Target:        EgressDir,
			ReadOnly:      true,
			VolumeOptions: &mount.VolumeOptions{NoCopy: true},
		})
	}
	for _, m := range sb.Mounts {
		mounts = append(mounts, mount.Mount{
			Type:     mount.TypeBind,
			Source:   translatePath(m.Source, p.cfg.HostPathMap),
			Target:   m.Target,
			ReadOnly: m.ReadOnly,
		})
	}
	return mounts
}

// createOptions is the hardened container of DESIGN.md section 6, whose processes
// run as uid and the group SandboxUID.
func (p *Pool) createOptions(sb *Sandbox, name string, uid int) client.ContainerCreateOptions {
	pids := sb.PIDs
	tmpfs := func(size int64) string {
		// Docker gives a tmpfs the owner of the image's directory; uid and gid make it
		// the container's user's whatever the image says.
		return fmt.Sprintf("rw,nosuid,nodev,noexec,uid=%d,gid=%d,mode=0700,size=%d", uid, SandboxUID, size)
	}
	var ulimits []*container.Ulimit
	if sb.Runtime == GVisor {
		// gVisor's kernel runs a sandbox's processes as tasks of its own. The host's
		// PIDs cgroup counts the host's threads of the sandbox instead: gVisor's
		// (about 25 idle) and, on the systrap platform, a stub for each of its
		// processes and threads (200 with 127 processes here); at the sandbox's own
		// limit a fork bomb crashed gVisor at 40 processes. So the host's limit is a
		// multiple of it, and the script's processes are bounded by RLIMIT_NPROC,
		// which gVisor counts per uid within the sandbox's kernel, threads included,
		// as the PIDs cgroup counts them. Not under runc, where that count is the
		// host's for the uid: with SharedUID it would be every container's.
		ulimits = []*container.Ulimit{{Name: "nproc", Soft: pids, Hard: pids}}
		pids *= gVisorHostPIDs
	}
	return client.ContainerCreateOptions{
		Name: name,
		Config: &container.Config{
			Image:        sb.Image,
			User:         fmt.Sprintf("%d:%d", uid, SandboxUID),
			Env:          p.env(sb),
			OpenStdin:    true,
			StdinOnce:    false,
			AttachStdin:  true,
			AttachStdout: true,
			AttachStderr: true,
			Tty:          false,
			WorkingDir:   "/workspace",
			// No network, even with egress (that is a Unix socket in EgressVolume): runc
			// still gives the container a namespace of its own with only loopback, but
			// dockerd makes no libnetwork sandbox for it and adds no prestart hook: with
			// network mode "none" alone, runc runs dockerd's whole binary again
			// (libnetwork-setkey) at every start: ~110 ms of the ~500 ms of CPU that a
			// spawn and a removal took here (docs/PERFORMANCE.md).
			NetworkDisabled: true,
			Labels: map[string]string{
				LabelManaged:  "true",
				LabelWorker:   p.cfg.WorkerID,
				LabelSandbox:  sb.Name,
				LabelChecksum: sb.Checksum,
			},
		},
		// No Init: the harness is PID 1. docker-init, running as the sandbox user,
		// held the attached stream where a script could open it (/proc/1/fd/0 and 1)
		// and stop the harness. The harness as PID 1 is not dumpable, so its /proc
		// entries are closed to scripts, and the kernel drops every signal sent to it
		// from inside the container, SIGKILL and SIGSTOP included (docs/SECURITY.md).
		HostConfig: &container.HostConfig{
			NetworkMode: "none",
			// The protocol is read from the attached stream; a logging driver would only
			// copy every line to the host's disk, where an output flood could fill it.
			LogConfig:      container.LogConfig{Type: "none"},
			ReadonlyRootfs: true,
			CapDrop:        []string{"ALL"},
			SecurityOpt:    append([]string{"no-new-privileges"}, seccompFor(sb.Runtime)...), // seccomp.go
			Runtime:        sb.Runtime,
			Tmpfs: map[string]string{
				"/workspace": tmpfs(sb.WorkspaceBytes),
				"/tmp":       tmpfs(sb.TmpBytes),
			},
			Mounts: p.mounts(sb),
			Resources: container.Resources{
				Memory:     sb.MemoryBytes,
				MemorySwap: sb.MemoryBytes, // no swap
				NanoCPUs:   sb.NanoCPUs,
				PidsLimit:  &pids,
				Ulimits:    ulimits,
			},
		},
	}
}

// gVisorHostPIDs is how many host PIDs a gVisor sandbox may use for each process its
// PIDs limit lets a script have (see createOptions).
const gVisorHostPIDs = 4

// createTimeout bounds a container's create, which Close waits for.
const createTimeout = time.Minute

// spawn creates, attaches, starts and waits for one container's harness. On failure
// it removes what it created and says why, with the tail of the container's stderr.
func (p *Pool) spawn(ctx context.Context, sb *sandbox) (*ctr, error) {
	name := fmt.Sprintf("jazzmine-%s-%s", sb.cfg.Name, randomHex(4))
	// The create is not cut short when ctx ends (Close): the engine goes on creating a
	// container whose request was aborted, and its id would be lost, the container
	// left behind in state created after Close's sweep. It is short, and bounded.
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), createTimeout)
	uid := p.takeUID()
	created, err := p.cfg.Docker.ContainerCreate(cctx, p.createOptions(&sb.cfg, name, uid))
	cancel()
	if err != nil {
		p.giveUID(uid)
		return nil, fmt.Errorf("create container for sandbox %q: %w", sb.cfg.Name, err)
	}
	c := &ctr{id: created.ID, name: name, sandbox: sb, uid: uid, stderr: &tailBuffer{max: 8 << 10}, born: time.Now()}
	fail := func(err error) (*ctr, error) {
		p.remove(c)
		if tail := strings.TrimSpace(c.stderr.String()); tail != "" {
			err = fmt.Errorf("%w; container stderr: %s", err, tail)
		}
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return fail(fmt.Errorf("spawn for sandbox %q abandoned after its create: %w", sb.cfg.Name, err))
	}
	// Attach before start, so that no early byte of the harness is lost.
	att, err := p.cfg.Docker.ContainerAttach(ctx, c.id, client.ContainerAttachOptions{Stream: true, Stdin: true, Stdout: true, Stderr: true})
	if err != nil {
		return fail(fmt.Errorf("attach to container %s of sandbox %q: %w", c.shortID(), sb.cfg.Name, err))
	}
	c.attach = att.HijackedResponse
	// Docker frames the attached stream with 8-byte headers. stdcopy splits it: stream 1
	// (the protocol) goes to the harness Conn through a pipe, stream 2 (the harness's
	// own stderr) to a bounded tail kept for error messages.
	pr, pw := io.Pipe()
	go func() {
		_, err := stdcopy.StdCopy(pw, c.stderr, att.Reader)
		if err == nil {
			err = io.EOF
		}
		pw.CloseWithError(err)
	}()
	c.conn = harness.NewConn(pr, att.Conn, 0)
	if _, err := p.cfg.Docker.ContainerStart(ctx, c.id, client.ContainerStartOptions{}); err != nil {
		return fail(fmt.Errorf("start container %s of sandbox %q: %w", c.shortID(), sb.cfg.Name, err))
	}
	rctx, cancel := context.WithTimeout(ctx, sb.cfg.ReadyTimeout)
	defer cancel()
	if c.ready, err = c.conn.WaitReady(rctx); err != nil {
		return fail(fmt.Errorf("container %s of sandbox %q sent no ready line within %v: %w", c.shortID(), sb.cfg.Name, sb.cfg.ReadyTimeout, err))
	}
	return c, nil
}

// remove kills and removes the container and closes its stream. It does not wait on
// the caller's context: a container is removed even when nobody waits for it.
func (p *Pool) remove(c *ctr) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := p.cfg.Docker.ContainerRemove(ctx, c.id, client.ContainerRemoveOptions{Force: true, RemoveVolumes: true}); err != nil && !isNotFound(err) {
		p.log.Warn("remove container", "container", c.shortID(), "sandbox", c.sandbox.cfg.Name, "err", err)
	}
	if c.conn != nil {
		c.conn.Close()
	}
	if c.attach.Conn != nil {
		c.attach.Close()
	}
	p.giveUID(c.uid)
}

// oomKilled reports whether Docker saw the container killed for memory.
func (p *Pool) oomKilled(c *ctr) bool {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	res, err := p.cfg.Docker.ContainerInspect(ctx, c.id, client.ContainerInspectOptions{})
	return err == nil && res.Container.State != nil && res.Container.State.OOMKilled
}

// tailBuffer keeps the last max bytes written to it.
type tailBuffer struct {
	mu  sync.Mutex
	max int
	b   []byte
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.b = append(t.b, p...)
	if over := len(t.b) - t.max; over > 0 {
		t.b = bytes.Clone(t.b[over:])
	}
	return len(p), nil
}

func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(t.b)
}
