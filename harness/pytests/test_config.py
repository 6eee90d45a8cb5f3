"""Unit tests of jazzmine_harness.config. Run with `make test-python`."""

import os
import subprocess
import sys
import unittest

from harness_process import HARNESS_DIR


class ConfigTest(unittest.TestCase):
    def test_unset_directories_are_never_wiped_outside_a_container(self):
        env = dict(os.environ)
        for k in ("JAZZMINE_WORKSPACE", "JAZZMINE_TMPDIR", "JAZZMINE_CONTAINER"):
            env.pop(k, None)
        out = subprocess.run(
            [sys.executable, "-c", "from jazzmine_harness import config; print(config.WORKSPACE, config.TMPDIR)"],
            cwd=HARNESS_DIR, env=env, capture_output=True, text=True, check=True,
        )
        self.assertEqual(out.stdout.split(), ["None", "None"])


if __name__ == "__main__":
    unittest.main()
