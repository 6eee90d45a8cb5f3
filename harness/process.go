package harness

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"syscall"
	"time"
)

// ProcessConfig describes a harness run as a local python3 process: for tests,
// benchmarks and development without Docker. It is not a sandbox.
type ProcessConfig struct {
	// Python is the interpreter; empty means "python3" from PATH.
	Python string
	// ToolsDir is JAZZMINE_TOOLS_DIR; empty means no tools.
	ToolsDir string
	// Workspace and TmpDir are JAZZMINE_WORKSPACE and JAZZMINE_TMPDIR, the directories
	// the harness wipes after each execution and on reset. Empty means the harness wipes
	// nothing (outside a container it never falls back to /workspace or /tmp).
	Workspace, TmpDir string
	// Env is added to the process's environment (secrets, for instance).
	Env []string
	// Stderr receives the harness's own stderr; nil discards it.
	Stderr io.Writer
	// ReadyTimeout bounds the wait for the ready event; zero means 30 s.
	ReadyTimeout time.Duration
}

// Process is a harness running as a local python3 process.
type Process struct {
	// Conn is the protocol stream of the process.
	Conn *Conn
	// Ready is what the harness announced at start.
	Ready Ready

	cmd    *exec.Cmd
	stdin  io.WriteCloser
	stdout io.ReadCloser
	dir    string
	waited chan struct{}
}

// StartProcess copies the embedded harness ([Source]) into a directory of its own,
// starts it there under a local interpreter ([Command]) and waits for its ready event.
// Close stops it and removes the directory.
func StartProcess(ctx context.Context, cfg ProcessConfig) (*Process, error) {
	dir, err := os.MkdirTemp("", "jazzmine-harness-")
	if err != nil {
		return nil, fmt.Errorf("start local harness: %w", err)
	}
	if err := os.CopyFS(dir, Source()); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("start local harness: %w", err)
	}
	python := cfg.Python
	if python == "" {
		python = "python3"
	}
	args := Command(python, dir)
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Env = append(os.Environ(),
		"JAZZMINE_TOOLS_DIR="+cfg.ToolsDir,
		"JAZZMINE_WORKSPACE="+cfg.Workspace,
		"JAZZMINE_TMPDIR="+cfg.TmpDir,
		"JAZZMINE_CONTAINER=0", // never let a host process act as a container's harness
	)
	cmd.Env = append(cmd.Env, cfg.Env...)
	cmd.Stderr = cfg.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("start local harness: %w", err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("start local harness: %w", err)
	}
	if err := cmd.Start(); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("start local harness %s: %w", python, err)
	}
	p := &Process{cmd: cmd, stdin: stdin, stdout: stdout, dir: dir, waited: make(chan struct{})}
	p.Conn = NewConn(stdout, stdin, 0)
	go func() {
		<-p.Conn.Done() // the stream ended: the process is gone or going
		_ = cmd.Wait()
		close(p.waited)
	}()
	readyTimeout := cfg.ReadyTimeout
	if readyTimeout <= 0 {
		readyTimeout = 30 * time.Second
	}
	rctx, cancel := context.WithTimeout(ctx, readyTimeout)
	defer cancel()
	p.Ready, err = p.Conn.WaitReady(rctx)
	if err != nil {
		p.Close()
		return nil, err
	}
	return p, nil
}

// PID is the harness's process id.
func (p *Process) PID() int { return p.cmd.Process.Pid }

// Close stops the harness: it closes stdin (the harness kills what its executions left
// and exits), then kills the process group if it has not gone within two seconds. It is
// safe to call more than once.
func (p *Process) Close() error {
	p.Conn.Close() // nobody reads after Close: let the reader run to EOF
	_ = p.stdin.Close()
	select {
	case <-p.waited:
	case <-time.After(2 * time.Second):
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		_ = p.stdout.Close()
		<-p.waited
	}
	err := os.RemoveAll(p.dir)
	if errors.Is(err, os.ErrNotExist) {
		err = nil
	}
	return err
}
