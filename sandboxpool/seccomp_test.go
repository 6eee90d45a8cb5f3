package sandboxpool_test

import (
	"context"
	"encoding/json"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/moby/moby/client"

	"github.com/jazzmine/worker/harness"
	"github.com/jazzmine/worker/internal/testenv"
	"github.com/jazzmine/worker/sandboxpool"
)

// seccompProbe is a script that makes, as an attacker would, each system call that the
// sandbox's seccomp profile should refuse, and reports the errno of each (0: it
// worked). Where it can, it picks arguments with which the call, if allowed, would
// succeed or fail with another errno than EPERM, so that EPERM is the profile's doing.
// Where the kernel itself answers EPERM first (no capability), the comment says so:
// run once with seccomp off (--security-opt seccomp=unconfined), every other call
// worked or failed with another errno. The numbers are x86-64's.
const seccompProbe = `
import ctypes, os, signal, time

libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long

def call(nr, *args):
    ctypes.set_errno(0)
    r = libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(a) for a in args])
    return (r, 0) if r != -1 else (r, ctypes.get_errno())

class iovec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]

buf = ctypes.create_string_buffer(b"secret", 64)
dst = ctypes.create_string_buffer(64)
local, remote = iovec(ctypes.addressof(dst), 6), iovec(ctypes.addressof(buf), 6)
iov = lambda v: ctypes.addressof(v)

# A victim the kernel would let us trace: our own child, made dumpable (as any process
# is after it executes a program), which holds buf at the same address as we do.
libc.prctl(4, 1, 0, 0, 0)  # PR_SET_DUMPABLE
victim = os.fork()
if victim == 0:
    time.sleep(60)
    os._exit(0)
pidfd = os.pidfd_open(os.getpid())
errnos = {}

def probe(name, nr, *args, close=False):
    r, e = call(nr, *args)
    errnos[name] = e
    if close and r >= 0:
        os.close(r)
    return r

PTRACE_ATTACH, PTRACE_DETACH = 16, 17
for name, pid in (("ptrace", victim), ("ptrace PID 1 (the harness)", 1), ("ptrace the zygote", os.getppid())):
    if probe(name, 101, PTRACE_ATTACH, pid, 0, 0) == 0:
        if pid == victim:
            os.waitpid(pid, 0)
        call(101, PTRACE_DETACH, pid, 0, 0)
probe("process_vm_readv", 310, victim, iov(local), 1, iov(remote), 1, 0)
probe("process_vm_readv of itself", 310, os.getpid(), iov(local), 1, iov(remote), 1, 0)
probe("process_vm_writev", 311, os.getpid(), iov(local), 1, iov(remote), 1, 0)
probe("process_madvise", 440, pidfd, 0, 0, 20, 0)  # MADV_COLD, no ranges
probe("pidfd_getfd", 438, pidfd, 0, 0, close=True)
probe("kcmp", 312, os.getpid(), victim, 0, 0, 1)  # KCMP_FILE: our fd 0 against its fd 1
probe("move_pages", 279, 0, 0, 0, 0, 0, 0)
probe("migrate_pages", 256, 0, 0, 0, 0)
probe("userfaultfd", 323, 1 | os.O_CLOEXEC, close=True)  # UFFD_USER_MODE_ONLY: no privilege needed
probe("perf_event_open", 298, 0, 0, -1, -1, 0)  # NULL attr: EFAULT
probe("bpf", 321, 0xffff, 0, 0)  # no such command: EINVAL
probe("keyctl", 250, 0, -3, 0)  # KEYCTL_GET_KEYRING_ID of the session keyring
probe("add_key", 248, 0, 0, 0, 0, 0)  # NULL type: EFAULT
probe("request_key", 249, 0, 0, 0, 0)
probe("io_uring_setup", 425, 1, 0)  # NULL params: EFAULT
probe("io_uring_enter", 426, -1, 0, 0, 0, 0, 0)  # EBADF
probe("io_uring_register", 427, -1, 0, 0, 0)
probe("unshare", 272, 0)  # unshare nothing: a no-op
probe("setns", 308, -1, 0)  # EBADF
probe("mount", 165, 0, 0, 0, 0, 0)  # NULL target: EFAULT
probe("umount2", 166, 0, 0x100)  # unknown flag: EINVAL
probe("mount_setattr", 442, -1, 0, 0, 0, 0)  # size 0: EINVAL
probe("move_mount", 429, -1, 0, -1, 0, 0)  # the kernel: EPERM without CAP_SYS_ADMIN
root = ctypes.create_string_buffer(b"/")
probe("open_tree", 428, -100, ctypes.addressof(root), 0, close=True)  # an O_PATH descriptor of /
probe("fsopen", 430, 0, 0)  # the kernel: EPERM without CAP_SYS_ADMIN
probe("fsconfig", 431, -1, 0xff, 0, 0, 0)  # EINVAL or EBADF
probe("fsmount", 432, -1, 0, 0)  # the kernel: EPERM without CAP_SYS_ADMIN
probe("fspick", 433, -1, 0, 0)  # the kernel: EPERM without CAP_SYS_ADMIN
probe("personality ADDR_NO_RANDOMIZE", 135, 0x0040000)
child = probe("clone CLONE_NEWUSER", 56, 0x10000000 | signal.SIGCHLD, 0, 0, 0, 0)  # a fork into a new user namespace
if child == 0:
    os._exit(0)
if child > 0:
    os.waitpid(child, 0)
# A fork whose child would be the zygote's, beside the script rather than under it.
child = probe("clone CLONE_PARENT", 56, 0x8000 | signal.SIGCHLD, 0, 0, 0, 0)
if child == 0:
    os._exit(0)
probe("clone3", 435, 0, 0)
# POSIX message queues, denied under gVisor only (which keeps them where nothing can
# list them); under runc the queue is made, and removed again.
mq = ctypes.create_string_buffer(b"jazzmine-probe")
probe("mq_open", 240, ctypes.addressof(mq), 0o102, 0o600, 0, close=True)  # O_CREAT | O_RDWR
probe("mq_timedsend", 242, -1, 0, 0, 0, 0)  # EBADF
probe("mq_timedreceive", 243, -1, 0, 0, 0, 0)
probe("mq_notify", 244, -1, 0)
probe("mq_getsetattr", 245, -1, 0, 0)
probe("mq_unlink", 241, ctypes.addressof(mq))  # the queue made above, or ENOENT
probe("socket AF_VSOCK", 41, 40, 1, 0)  # a socket to the VM's host, network or not
probe("socket AF_ALG", 41, 38, 5, 0)  # the kernel's crypto API
os.kill(victim, signal.SIGKILL)
os.waitpid(victim, 0)
emit_result(errnos)
`

// pythonStillWorks is a script that does what ordinary Python does with processes,
// threads and memory, and reports whether each worked.
const pythonStillWorks = `
import asyncio, mmap, multiprocessing, os, socket, subprocess, sys, threading
ok = {}
seen = []
threads = [threading.Thread(target=seen.append, args=(i,)) for i in range(4)]
[t.start() for t in threads]
[t.join() for t in threads]
ok["threads"] = sorted(seen) == [0, 1, 2, 3]
with multiprocessing.get_context("fork").Pool(2) as pool:
    ok["multiprocessing"] = pool.map(abs, [-1, -2, -3]) == [1, 2, 3]
async def answer():
    await asyncio.sleep(0.01)
    return 42
ok["asyncio"] = asyncio.run(answer()) == 42
pid = os.fork()
if pid == 0:
    os._exit(7)
ok["os.fork"] = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 7
m = mmap.mmap(-1, 1 << 20)
m[:5] = b"hello"
ok["mmap"] = m[:5] == b"hello"
srv = socket.create_server(("127.0.0.1", 0))
cli = socket.create_connection(srv.getsockname(), timeout=5)
conn, _ = srv.accept()
cli.sendall(b"ping")
ok["loopback socket"] = conn.recv(4) == b"ping"
a, b = socket.socketpair()
a.sendall(b"pong")
ok["socketpair"] = b.recv(4) == b"pong"
ok["subprocess"] = subprocess.run([sys.executable, "-c", "print(6 * 7)"], capture_output=True, timeout=10).stdout == b"42\n"
fd = os.pidfd_open(os.getpid())
os.close(fd)
ok["os.pidfd_open"] = True
emit_result(ok)
`

// TestTheSeccompProfileRefusesWhatReachesIntoOtherProcesses plays the attacker of
// sandboxpool/seccomp.go from inside a sandbox: every system call that the profile
// denies fails with EPERM, and so do the calls and socket families that Docker's
// default filters by their arguments; ordinary Python still works. Without the
// profile (Docker 20.10's built-in one), ptrace of the script's own child,
// io_uring_setup, io_uring_enter, io_uring_register and an AF_VSOCK socket succeed.
// Under gVisor, whose kernel applies the same profile (runsc --oci-seccomp), the same
// holds, and POSIX message queues are denied too; without --oci-seccomp, gVisor's
// kernel let the script ptrace and read its own child, make a user namespace, clone
// with CLONE_PARENT and open_tree.
func TestTheSeccompProfileRefusesWhatReachesIntoOtherProcesses(t *testing.T) {
	if runtime.GOARCH != "amd64" {
		t.Skip("the probe calls system calls by their x86-64 numbers")
	}
	testenv.EachRuntime(t, testSeccompProfile)
}

func testSeccompProfile(t *testing.T, rt string) {
	p := newPool(t, sandboxpool.Config{Sandboxes: []sandboxpool.Sandbox{sandboxUnder(t, rt, "seccomp", 1, 0)}})
	// A lease serves one execution; each subtest takes its own.
	runAlone := func(t *testing.T, script string) *harness.Result {
		l := checkout(t, p, "seccomp")
		defer l.Release()
		return run(t, l, script)
	}

	denied := deniedCalls(t, p, "seccomp") // each must have a probe

	t.Run("every denied call fails with EPERM", func(t *testing.T) {
		res := runAlone(t, seccompProbe)
		if !res.Success {
			t.Fatalf("probe failed: %s\n%s", res.Error, res.Traceback)
		}
		var errnos map[string]int
		if err := json.Unmarshal(res.FinalData, &errnos); err != nil {
			t.Fatal(err)
		}
		t.Logf("errnos: %s", res.FinalData)
		// Beyond the profile's list: the other processes an attacker would aim at, and
		// the calls Docker's default filters by their arguments.
		want := map[string]syscall.Errno{
			"ptrace PID 1 (the harness)":    syscall.EPERM,
			"ptrace the zygote":             syscall.EPERM,
			"process_vm_readv of itself":    syscall.EPERM,
			"personality ADDR_NO_RANDOMIZE": syscall.EPERM,
			"clone CLONE_NEWUSER":           syscall.EPERM,
			"clone CLONE_PARENT":            syscall.EPERM,
			"socket AF_VSOCK":               syscall.EPERM,
			"socket AF_ALG":                 syscall.EPERM,
			// Not EPERM on purpose: the C library falls back to clone on ENOSYS.
			"clone3": syscall.ENOSYS,
			// A queue is made (and removed) under runc, which empties /dev/mqueue.
			"mq_open": 0,
		}
		if rt == sandboxpool.GVisor {
			want["mq_open"] = syscall.EPERM
		}
		for _, name := range denied {
			want[name] = syscall.EPERM
		}
		for name, errno := range want {
			got, probed := errnos[name]
			switch {
			case !probed:
				t.Errorf("%s: the profile denies it but the probe does not try it", name)
			case syscall.Errno(got) != errno:
				t.Errorf("%s: errno %d (%v), want %d (%v)", name, got, syscall.Errno(got), int(errno), errno)
			}
		}
	})

	t.Run("ordinary Python still works", func(t *testing.T) {
		res := runAlone(t, pythonStillWorks)
		if !res.Success {
			t.Fatalf("script failed: %s\n%s", res.Error, res.Traceback)
		}
		var ok map[string]bool
		if err := json.Unmarshal(res.FinalData, &ok); err != nil {
			t.Fatal(err)
		}
		for _, what := range []string{"threads", "multiprocessing", "asyncio", "os.fork", "mmap", "loopback socket", "socketpair", "subprocess", "os.pidfd_open"} {
			if !ok[what] {
				t.Errorf("%s does not work in a sandbox: %s", what, res.FinalData)
			}
		}
	})
}

// deniedCalls are the system calls that a container of the sandbox has its seccomp
// profile deny with EPERM, as the engine received the profile.
func deniedCalls(t *testing.T, p *sandboxpool.Pool, name string) []string {
	t.Helper()
	l := checkout(t, p, name)
	id := l.ContainerID()
	l.Release()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	info, err := docker(t).ContainerInspect(ctx, id, client.ContainerInspectOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var denied []string
	for _, opt := range info.Container.HostConfig.SecurityOpt {
		profile, ok := strings.CutPrefix(opt, "seccomp=")
		if !ok {
			continue
		}
		var prof struct {
			Syscalls []struct {
				Names    []string `json:"names"`
				Action   string   `json:"action"`
				ErrnoRet *uint    `json:"errnoRet"`
			} `json:"syscalls"`
		}
		if err := json.Unmarshal([]byte(profile), &prof); err != nil {
			t.Fatalf("the container's seccomp profile is not JSON: %v", err)
		}
		for _, r := range prof.Syscalls {
			if r.Action == "SCMP_ACT_ERRNO" && r.ErrnoRet != nil && *r.ErrnoRet == uint(syscall.EPERM) {
				denied = append(denied, r.Names...)
			}
		}
	}
	if !slices.Contains(denied, "ptrace") {
		t.Fatalf("the container's security options %.200q deny no ptrace with EPERM", info.Container.HostConfig.SecurityOpt)
	}
	return denied
}
