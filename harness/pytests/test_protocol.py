"""Tests of jazzmine_harness.protocol: that the names it lists are the names the
package uses. (The harness's Go test TestThePythonHarnessNamesWhatGoNames holds
them to Go's.) Run with `make test-python`."""

import ast
import os
import unittest

from harness_process import PACKAGE_DIR
from jazzmine_harness import protocol


def modules():
    """Each module of the package: its name and its syntax tree."""
    for name in sorted(os.listdir(PACKAGE_DIR)):
        if name.endswith(".py"):
            with open(os.path.join(PACKAGE_DIR, name)) as f:
                yield name, ast.parse(f.read(), name)


class NamesTest(unittest.TestCase):
    def test_every_event_and_error_the_package_writes_uses_a_listed_name(self):
        # A string written as the type or kind of an event, say {"type": "eror"}, is a
        # name Go's test never sees: each must be one of protocol's constants.
        listed = set(protocol.EVENT_TYPES) | set(protocol.ERROR_KINDS) | set(protocol.REQUEST_TYPES)
        for name, tree in modules():
            for node in ast.walk(tree):
                if not isinstance(node, ast.Dict):
                    continue
                for key, value in zip(node.keys, node.values):
                    if isinstance(key, ast.Constant) and key.value in ("type", "kind"):
                        self.assertNotIsInstance(value, ast.Constant, "%s:%d: a %s written as a literal: %r" % (name, value.lineno, key.value, getattr(value, "value", None)))
                        if isinstance(value, ast.Attribute) and isinstance(value.value, ast.Name) and value.value.id == "p":
                            self.assertIn(getattr(protocol, value.attr), listed | {protocol.WARM, protocol.DONE}, "%s:%d" % (name, value.lineno))

    def test_each_list_holds_each_name_once(self):
        for names in (protocol.EVENT_TYPES, protocol.ERROR_KINDS, protocol.REQUEST_TYPES, protocol.MODES, protocol.CHILD_EVENT_TYPES):
            self.assertEqual(len(set(names)), len(names), names)
        self.assertLessEqual(set(protocol.CHILD_EVENT_TYPES), set(protocol.EVENT_TYPES))

    def test_a_childs_own_lines_are_the_types_the_parent_looks_for(self):
        self.assertEqual(protocol.WARM_LINE, protocol.encode({"type": protocol.WARM}))
        self.assertEqual(protocol.DONE_LINE, protocol.encode({"type": protocol.DONE}))
        self.assertNotIn(protocol.WARM, protocol.EVENT_TYPES)
        self.assertNotIn(protocol.DONE, protocol.EVENT_TYPES)


if __name__ == "__main__":
    unittest.main()
