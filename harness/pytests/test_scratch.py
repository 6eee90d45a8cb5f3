"""Unit tests of jazzmine_harness.scratch, the wipe. Run with `make test-python`."""

import os
import subprocess
import tempfile
import unittest

import harness_process  # noqa: F401 (puts the package on the path)
from jazzmine_harness import scratch
from jazzmine_harness.limits import Retire


class WipeTest(unittest.TestCase):
    def test_removes_everything_inside_but_not_the_directory_nor_link_targets(self):
        with tempfile.TemporaryDirectory() as outside, tempfile.TemporaryDirectory() as d:
            keep = os.path.join(outside, "keep.txt")
            open(keep, "w").close()
            open(os.path.join(d, ".dot"), "w").close()
            os.makedirs(os.path.join(d, "a", "b"))
            open(os.path.join(d, "a", "b", "f"), "w").close()
            os.chmod(os.path.join(d, "a", "b"), 0o500)
            os.chmod(os.path.join(d, "a"), 0o500)
            os.symlink(outside, os.path.join(d, "link"))
            os.symlink(outside, os.path.join(d, "a", "b", "deeplink"))
            scratch.Scratch(d).wipe()
            self.assertEqual(os.listdir(d), [])
            self.assertTrue(os.path.exists(keep), "wipe followed a symlink out of the directory")

    def _dead_drop(self, d, depth, name_len):
        """What an attacker leaves: a tree deeper than PATH_MAX, every level made
        searchable only (0o111), with a file at the bottom."""
        fd = os.open(d, os.O_RDONLY)
        fds = [fd]
        for i in range(depth):
            n = ("L%02d" % (i % 100)) * (name_len // 3)
            os.mkdir(n, dir_fd=fd)
            fd = os.open(n, os.O_RDONLY, dir_fd=fd)
            fds.append(fd)
        os.close(os.open("loot", os.O_WRONLY | os.O_CREAT, 0o600, dir_fd=fd))
        for parent, n in zip(fds, [("L%02d" % (i % 100)) * (name_len // 3) for i in range(depth)]):
            os.chmod(n, 0o111, dir_fd=parent)
        for f in fds:
            os.close(f)

    def test_removes_trees_past_path_max_made_unreadable_at_every_level(self):
        with tempfile.TemporaryDirectory() as d:
            wiped = scratch.Scratch(d)  # as the harness opens it at start, mode 0o700
            self._dead_drop(d, 20, 240)  # 20 levels of 240 characters: past PATH_MAX
            open(os.path.join(d, ".local"), "w").close()
            os.chmod(d, 0o000)
            wiped.wipe()
            self.assertEqual(os.listdir(d), [])
            self.assertEqual(os.stat(d).st_mode & 0o777, 0o700, "the directory's own mode is given back")

    def test_a_tree_too_deep_to_wipe_retires_the_container(self):
        with tempfile.TemporaryDirectory() as d:
            self._dead_drop(d, scratch.WIPE_DEPTH + 10, 3)
            with self.assertRaises(Retire):
                scratch.Scratch(d).wipe()
            # What the test made is still removable by its owner.
            subprocess.run(["chmod", "-R", "u+rwx", d], check=True)


if __name__ == "__main__":
    unittest.main()


class SysvIpcTest(unittest.TestCase):
    def test_objects_left_where_the_kernel_lists_none_retire_the_container(self):
        # gVisor has no /proc/sysvipc: the harness counts the objects instead and
        # retires the container if an execution left any. Here the host's kernel
        # plays it, with the listing files forgotten; the segment is this test's own.
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        shmid = libc.shmget(0, 4096, 0o600)  # IPC_PRIVATE
        self.assertGreaterEqual(shmid, 0, os.strerror(ctypes.get_errno()))
        try:
            ipc = scratch.SysvIpc()
            ipc.kinds = []
            with self.assertRaises(Retire) as cm:
                ipc.remove_all()
            self.assertIn("shared memory", str(cm.exception))
        finally:
            libc.shmctl(shmid, 0, None)  # IPC_RMID
