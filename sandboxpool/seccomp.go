//go:build linux

package sandboxpool

import (
	"encoding/json"
	"slices"

	"github.com/moby/profiles/seccomp"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
)

// The seccomp profile of every sandbox: Docker's default profile, as the Moby project
// keeps it in github.com/moby/profiles/seccomp, with the system calls of deniedSyscalls
// denied (EPERM, so that a script sees a PermissionError rather than dying of SIGSYS).
//
// Taking the library's profile rather than the engine's built-in one also brings the
// engine's default up to date. Against the profile of Docker 20.10 (the engine here),
// resolved for a sandbox by the engine itself, it:
//   - allows socket() only for the address families still in the kernel, and not
//     AF_VSOCK or AF_ALG. Under 20.10's profile a sandbox with no network opened an
//     AF_VSOCK socket to the host of the VM it ran in (CID 2), and something there
//     answered; AF_ALG is the kernel's crypto API, a surface no script needs;
//   - no longer allows io_uring (denied below as well);
//   - allows the calls added to the kernel since: cachestat, fchmodat2, futex_wait,
//     futex_wake, futex_requeue, the *xattrat calls, listmount, statmount,
//     map_shadow_stack, mseal, uretprobe, pkey_*, and name_to_handle_at.
//
// The library's DefaultProfile is Linux-only (its socket rules use golang.org/x/sys/unix's
// AF_ constants, whose values differ on other systems); seccomp_other.go says what a
// worker built for another system does. (containers/common keeps Podman's profile, not
// Docker's; a JSON file copied from Moby's repository would not follow its fixes.)
//
// The profile is conditional, as Docker's is: the engine resolves each rule's
// capabilities, architectures and minimum kernel when it creates the container. A
// sandbox has no capabilities, so the rules that need one never apply to it. The engine
// accepts it inline (API 1.41, Docker 20.10.24: sandboxpool's seccomp test).
//
// Every process of a sandbox runs as the sandbox uid: the harness (PID 1), the zygote,
// the script and whatever it starts. The kernel lets a process reach into another of its
// uid wherever that one is dumpable. The harness and everything it forks are not; but
// any process that executes a program is dumpable again, and the kernel's checks would
// be the only wall if one of ours ever did. The calls below make that wall two.
//
// There is no per-sandbox way out: nothing denied here is something a Python script
// needs (debuggers and profilers that trace other processes would also need
// CAP_SYS_PTRACE, which a sandbox never has).

// deniedSyscalls are denied with EPERM on top of Docker's default, and removed from
// every rule of it that names them, whatever the rule's conditions: a sandbox needs none
// of them and an attacker would like each one. The comments say what Docker's default
// does for a process with no capabilities (the library's profile; the 20.10 engine's
// built-in one where it differs).
var deniedSyscalls = [][]string{
	// Reaching into another process of the container.
	{
		// Attach to, read, write and steer another process. Allowed by the default
		// (kernel >= 4.8), and under it a script attached to docker-init when that was
		// the container's PID 1: dumpable, of the same uid, and spared by every reset.
		// A script traces nothing of its own in ordinary use, and ptrace has had its
		// own kernel bugs (PTRACE_TRACEME, CVE-2019-13272).
		"ptrace",
		// Read and write another process's memory, with the same permission check as a
		// ptrace attach. Allowed by the library's default (kernel >= 4.8); the 20.10
		// engine's built-in profile leaves them to CAP_SYS_PTRACE.
		"process_vm_readv", "process_vm_writev",
		// Advise the kernel on another process's memory; copy a file descriptor (such as
		// a protocol pipe) out of another process; compare the kernel objects behind two
		// processes' descriptors and memory. The default leaves them to CAP_SYS_PTRACE.
		"process_madvise", "pidfd_getfd", "kcmp",
		// Move another process's pages between NUMA nodes, and report where they are.
		// Not in the default.
		"move_pages", "migrate_pages",
	},
	// Kernel surface that a Python script has no use for and exploits do.
	{
		// Stalls the kernel at a page fault of the caller's choosing: the classic way to
		// widen a kernel race. Not in the default. (The sysctl that keeps it from the
		// unprivileged still lets them handle user-mode faults: with seccomp off, a
		// sandbox opened one.)
		"userfaultfd",
		// Performance counters: side channels, and a long record of kernel bugs. The
		// default leaves it to CAP_PERFMON or CAP_SYS_ADMIN.
		"perf_event_open",
		// The default leaves it to CAP_BPF or CAP_SYS_ADMIN.
		"bpf",
		// Kernel keyrings are not namespaced: a container's uid's keyrings are those
		// of that uid on the host. Not in the default.
		"keyctl", "add_key", "request_key",
		// Work submitted through a ring is never seen by seccomp, and io_uring has been
		// the way in of many kernel exploits. Not in the library's default; allowed by
		// 20.10's, where a sandbox could set up a ring.
		"io_uring_setup", "io_uring_enter", "io_uring_register",
	},
	// Namespaces and mounts. A new user namespace would give the script every capability
	// over the namespaces it then makes (the first step of most container escapes; this
	// kernel allows them to the unprivileged: with seccomp off, a sandbox made one); the
	// default leaves these calls to CAP_SYS_ADMIN, which a sandbox never has. clone and
	// clone3 stay as the default has them (clone is allowed only without namespace
	// flags, and clone3, whose flags seccomp cannot read, answers ENOSYS, which makes
	// the C library fall back to clone; EPERM there would break every thread and fork),
	// but for deniedCloneFlags and the way clone3's ENOSYS is given (clone3ENOSYS).
	{
		"unshare", "setns",
		"mount", "umount2", "mount_setattr", "move_mount", "open_tree",
		"fsopen", "fsconfig", "fsmount", "fspick",
	},
	// Kept from the default on purpose:
	//   - personality: the default allows only five values (PER_LINUX, PER_LINUX32,
	//     UNAME26 with either, and the query), none of which turns address-space
	//     randomisation off.
	//   - pidfd_open and pidfd_send_signal: a signal through a pidfd is checked as
	//     kill(2) is, which a script can call anyway, and Python uses them
	//     (os.pidfd_open; asyncio's PidfdChildWatcher waits for children with it).
	//   - process_mrelease: it only frees sooner the memory of a process already being
	//     killed.
}

// clone3ENOSYS: the default profile answers clone3 with ENOSYS (SCMP_ACT_ERRNO and
// errnoRet 38), so that the C library falls back to clone, whose flags seccomp can
// read; any other errno makes it fail, and every thread with it. gVisor applies a
// container's profile inside its own kernel (runsc --oci-seccomp, as make gvisor
// registers it) but answers every SCMP_ACT_ERRNO rule with EPERM, whatever its errnoRet:
// under it, Python could start no thread. So the rule is SCMP_ACT_TRACE instead, which
// both kernels answer with ENOSYS when no tracer is attached (seccomp(2); gVisor's
// pkg/sentry/kernel/seccomp.go), and none can be from inside: ptrace is denied to
// every process of a sandbox (a tracer of the host's root would let clone3 through,
// unfiltered, and root of the host has the sandbox anyway). One profile for both
// runtimes; the seccomp test checks the ENOSYS under each.

// deniedCloneFlags are refused to clone on top of the namespace flags that Docker's
// default refuses. CLONE_PARENT makes the new process its caller's sibling: a script's
// would be the zygote's child, outside the script's process group and not an orphan
// the harness inherits, so that only the harness's last sweep of the container's
// processes would find it (such a process could run on through every later execution
// of its container). Neither fork, threads nor posix_spawn use it.
const deniedCloneFlags = unix.CLONE_PARENT

// deniedUnderGVisor are denied as well to a sandbox under gVisor: POSIX message
// queues. gVisor's kernel keeps them but mounts no mqueue filesystem at /dev/mqueue
// (it ignores that mount of the container's spec), where the harness empties them
// after every execution under runc: a queue would carry data from one execution to
// the next, and nothing could list it. Neither Python nor a library a script uses
// needs them.
var deniedUnderGVisor = []string{"mq_open", "mq_unlink", "mq_timedsend", "mq_timedreceive", "mq_notify", "mq_getsetattr"}

// seccompOpts are the security options that give a sandbox the profile: its JSON
// inline, as the docker CLI sends the file named by --security-opt seccomp=FILE. They
// are built once, when the package is initialised.
var (
	seccompOpts       = []string{"seccomp=" + mustJSON(seccompProfile(false))}
	seccompOptsGVisor = []string{"seccomp=" + mustJSON(seccompProfile(true))}
)

// seccompFor is the security options of the profile for a sandbox of runtime.
func seccompFor(runtime string) []string {
	if runtime == GVisor {
		return seccompOptsGVisor
	}
	return seccompOpts
}

// seccompProfile is Docker's default profile with deniedSyscalls denied, and
// deniedUnderGVisor too for gVisor.
func seccompProfile(gVisor bool) *seccomp.Seccomp {
	var deny []string
	for _, group := range deniedSyscalls {
		deny = append(deny, group...)
	}
	if gVisor {
		deny = append(deny, deniedUnderGVisor...)
	}
	p := seccomp.DefaultProfile()
	rules := p.Syscalls[:0]
	for _, r := range p.Syscalls {
		r.Names = slices.DeleteFunc(r.Names, func(n string) bool { return slices.Contains(deny, n) })
		if slices.Contains(deny, r.Name) {
			r.Name = ""
		}
		if len(r.Names) > 0 || r.Name != "" {
			rules = append(rules, r)
		}
		if slices.Equal(r.Names, []string{"clone3"}) && r.Action == specs.ActErrno {
			// ENOSYS as a tracer's absence gives it (see clone3ENOSYS).
			r.Action, r.ErrnoRet = specs.ActTrace, nil
		}
		if slices.Equal(r.Names, []string{"clone"}) && r.Action == specs.ActAllow {
			for i, a := range r.Args { // the flags, masked: allowed when none is set
				if a.Op == specs.OpMaskedEqual && a.Value&unix.CLONE_NEWUSER != 0 {
					r.Args[i].Value |= deniedCloneFlags
				}
			}
		}
	}
	eperm := uint(unix.EPERM)
	p.Syscalls = append(rules, &seccomp.Syscall{
		LinuxSyscall: specs.LinuxSyscall{Names: deny, Action: specs.ActErrno, ErrnoRet: &eperm},
		Comment:      "jazzmine: denied to sandboxes, see sandboxpool/seccomp.go",
	})
	return p
}

func mustJSON(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		panic("sandboxpool: marshal the seccomp profile: " + err.Error())
	}
	return string(b)
}
