"""What a script may change on the zygote or the harness that the harness cannot undo
(jazzmine_harness.limits.Limits), each changed as a script of the same uid would. Run
with `make test-python`."""

import ctypes
import os
import resource
import struct
import subprocess
import sys
import unittest

import harness_process  # noqa: F401 (the package on the path)
from jazzmine_harness import limits

_SYS_SCHED_SETATTR = {"x86_64": 314, "aarch64": 274}.get(os.uname().machine)
_SYS_SCHED_GETATTR = {"x86_64": 315, "aarch64": 275}.get(os.uname().machine)


def runtime(pid):
    """The sched_runtime of pid's struct sched_attr: the fair class's slice."""
    attr = ctypes.create_string_buffer(48)
    if ctypes.CDLL(None, use_errno=True).syscall(_SYS_SCHED_GETATTR, pid, attr, 48, 0) != 0:
        raise OSError(ctypes.get_errno(), "sched_getattr")
    return struct.unpack_from("=IIQiIQ", attr.raw)[5]


class LimitsTest(unittest.TestCase):
    def setUp(self):
        # The target, as the zygote is a script's: another process of our uid.
        self.target = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        self.addCleanup(self.target.wait)
        self.addCleanup(self.target.kill)
        self.limits = limits.Limits(self.target.pid)

    def test_an_unchanged_process_passes(self):
        self.limits.check("the target")
        self.limits.check("the target")

    def test_a_lowered_nice_value_retires(self):
        os.setpriority(os.PRIO_PROCESS, self.target.pid, 19)
        with self.assertRaisesRegex(limits.Retire, "scheduling of the target"):
            self.limits.check("the target")

    def test_a_lowered_limit_retires(self):
        resource.prlimit(self.target.pid, resource.RLIMIT_NOFILE, (64, 64))
        with self.assertRaises(limits.Retire):
            self.limits.check("the target")

    def test_without_sched_getattr_the_rest_is_still_checked(self):
        # gVisor answers sched_getattr with ENOSYS: the check must not turn off with it
        # (a review found a baseline of None, which every later read matched).
        number, limits._SYS_SCHED_GETATTR = limits._SYS_SCHED_GETATTR, 1 << 20  # no such call
        self.addCleanup(setattr, limits, "_SYS_SCHED_GETATTR", number)
        checked = limits.Limits(self.target.pid)
        self.assertIsNotNone(checked.baseline)
        os.setpriority(os.PRIO_PROCESS, self.target.pid, 19)
        with self.assertRaises(limits.Retire):
            checked.check("the target")

    def test_a_longer_time_slice_retires(self):
        # sched_setattr of SCHED_OTHER with a runtime: the fair class's slice (kernel
        # 6.12 and later), which every process the target forks inherits. A review's
        # attack gave the zygote 100 ms, and every later execution had it.
        if _SYS_SCHED_SETATTR is None:
            self.skipTest("sched_setattr's number is known for x86-64 and arm64 only")
        before = runtime(self.target.pid)
        # struct sched_attr: size, policy, flags, nice, priority, runtime, deadline, period.
        attr = ctypes.create_string_buffer(struct.pack("=IIQiIQQQ", 48, 0, 0, 0, 0, 100_000_000, 0, 0), 48)
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.syscall(_SYS_SCHED_SETATTR, self.target.pid, attr, 0) != 0:
            self.skipTest("sched_setattr: %s" % os.strerror(ctypes.get_errno()))
        if runtime(self.target.pid) == before:
            self.skipTest("this kernel has no per-task slice: the runtime was ignored")
        with self.assertRaises(limits.Retire):
            self.limits.check("the target")


if __name__ == "__main__":
    unittest.main()
