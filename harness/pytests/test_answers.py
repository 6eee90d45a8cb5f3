"""What a script's run gives back, as a code interpreter gives it (DESIGN section 5):
the last expression's value as IPython's Out, a result for plan mode, fresh entropy,
errors that teach, what the execution cost."""

import json
import os
import subprocess
import sys
import unittest

from harness_process import HARNESS_DIR, HarnessProcess, HarnessTest


def of(events, kind):
    return [e for e in events if e["type"] == kind]


class LastExpressionTest(HarnessTest):
    REQUEST = {"mode": "interactive"}

    def out(self, script):
        """The text/plain of the script's Out, or None, and its final_result data."""
        events = self.execute("e", script)
        self.assertEqual(of(events, "error"), [])
        outs = of(events, "execute_result")
        results = [e["data"] for e in of(events, "final_result")]
        return (outs[0]["data"]["text/plain"] if outs else None), results

    def test_the_last_expression_is_shown_as_ipython_shows_it(self):
        self.assertEqual(self.out("x = 6\nx * 7"), ("42", [42]))
        self.assertEqual(self.out("list(range(30))"), ("[" + ",\n ".join(map(str, range(30))) + "]", [list(range(30))]))
        self.assertEqual(self.out("{'b': 1, 'a': 2}"), ("{'b': 1, 'a': 2}", [{"b": 1, "a": 2}]))
        self.assertEqual(self.out("{'pear', 'apple', 'fig'}"), ("{'apple', 'fig', 'pear'}", [["apple", "fig", "pear"]]))
        self.assertEqual(self.out("'multi\\nline'"), ("'multi\\nline'", ["multi\nline"]))
        self.assertEqual(self.out("import sys\nsys.stderr.write('careful\\n')"), ("8", [8]))

    def test_what_ipython_does_not_show_is_not_shown(self):
        for script in ("x = 5", "3;", "x = 5\nx;  # silenced", "None", "print('a')", "if True:\n    5", "for i in range(2):\n    i", "def f():\n    return 1"):
            with self.subTest(script=script):
                self.assertEqual(self.out(script), (None, []))

    def test_only_the_last_statement_is_shown(self):
        self.assertEqual(self.out("1 + 1\n2 + 2"), ("4", [4]))
        self.assertEqual(self.out("x = 5\nx  # a comment; not a semicolon"), ("5", [5]))
        self.assertEqual(self.out("print('a'); 5"), ("5", [5]))

    def test_a_value_without_a_json_form_has_its_text_as_the_result(self):
        text, results = self.out("class P:\n    def __repr__(self):\n        return 'P()'\nP()")
        self.assertEqual((text, results), ("P()", ["P()"]))

    def test_a_large_value_has_its_text_as_the_result(self):
        text, results = self.out("list(range(100000))")
        self.assertTrue(text.endswith(" 999,\n ...]"), text[-40:])  # IPython shows 1,000 items
        self.assertEqual(results, [text])

    def test_a_long_text_is_shown_once_not_sent_again_as_the_result(self):
        events = self.execute("e", "s = 'x' * 600_000\ns")
        self.assertEqual(of(events, "error"), [])
        self.assertEqual([len(e["data"]["text/plain"]) for e in of(events, "execute_result")], [600_002])
        self.assertEqual(of(events, "final_result"), [])

    def test_a_value_whose_form_raises_is_shown_and_its_text_is_the_result(self):
        events = self.execute("e", "import decimal\n{decimal.Decimal('NaN'), decimal.Decimal(1)}")
        self.assertEqual(of(events, "error"), [])
        self.assertEqual([e["data"] for e in of(events, "final_result")], [of(events, "execute_result")[0]["data"]["text/plain"]])

    def test_a_top_level_await_runs_the_whole_cell_on_one_loop(self):
        script = "import asyncio\nasync def work(i):\n    await asyncio.sleep(0)\n    return i\ntasks = [asyncio.create_task(work(i)) for i in range(3)]\nawait asyncio.gather(*tasks)"
        self.assertEqual(self.out(script), ("[0, 1, 2]", [[0, 1, 2]]))

    def test_a_module_in_the_workspace_imports(self):
        self.assertEqual(self.out("open('helpers.py', 'w').write('X = 3')\nimport helpers\nhelpers.X"), ("3", [3]))

    def test_emit_result_wins_over_the_last_expression(self):
        events = self.execute("e", "emit_result('explicit')\n42")
        self.assertEqual([e["data"] for e in of(events, "final_result")], ["explicit"])
        self.assertEqual([e["data"]["text/plain"] for e in of(events, "execute_result")], ["42"])

    def test_a_value_repr_that_fails_is_said_on_stderr_and_the_cell_succeeds(self):
        events = self.execute("e", "class Bad:\n    def __repr__(self):\n        raise ValueError('no repr')\nBad()")
        self.assertEqual(of(events, "execute_result"), [])
        self.assertEqual(of(events, "error"), [])
        self.assertIn("could not be shown: ValueError: no repr", "".join(e["text"] for e in of(events, "stderr")))

    def test_a_html_repr_is_a_form_of_the_out(self):
        events = self.execute("e", "class P:\n    def _repr_html_(self):\n        return '<b>P</b>'\n    def __repr__(self):\n        return 'P()'\nP()")
        self.assertEqual(of(events, "execute_result")[0]["data"], {"text/plain": "P()", "text/html": "<b>P</b>"})


class OrderTest(unittest.TestCase):
    def test_printed_output_and_events_come_in_the_order_the_script_made_them(self):
        # The parent may read many events at once: it relays, before each, only what
        # was printed before it. In a session too, where the counts go on.
        h = HarnessProcess()
        self.addCleanup(h.close)
        script = "for i in range(200):\n    print(i)\n    emit_log(str(i))"
        for session in (False, True, True):
            h.send(type="execute", execution_id="o", script=script, mode="interactive", session=session, nonce="n")
            events = h.until("script_done")
            h.read()
            got = "".join(e["text"] if e["type"] == "stdout" else "|%s|" % e["message"] for e in events if e["type"] in ("stdout", "log"))
            self.assertEqual(got, "".join("%d\n|%d|" % (i, i) for i in range(200)))

    def test_a_warm_up_line_left_in_the_pipe_relays_nothing(self):
        # On a busy host the execute can come before the parent read the child's
        # warm-up line: it is then read with the script's events, after what the
        # script printed. It was taken for a line without counts, which relays what
        # the pipes hold, and put all of it before the first event.
        out = subprocess.run([sys.executable, "-c", WARM_LEFT], cwd=HARNESS_DIR, capture_output=True, timeout=30)
        self.assertEqual(out.returncode, 0, out.stderr.decode())
        self.assertEqual(out.stdout.decode(), "0\n|0|1\n|1|")


# A run fed, as if by its child, a warm-up line and two events, with the child's
# output already in its pipe; prints the stdout and log events it relays, in order.
WARM_LEFT = """
import json, os
from jazzmine_harness import protocol as p, run

class Out:
    written = 0
    lines = []
    def write(self, line):
        self.written += len(line)
        self.lines.append(json.loads(line))

class Cpu:
    def read(self):
        return None

class Harness:
    out, cpu = Out(), Cpu()

class Child:
    def __init__(self, fd):
        self.fds = {p.STDOUT: fd}
        self.relayed = {p.STDOUT: 0, p.STDERR: 0}
        self.pulled = {p.STDOUT: bytearray(), p.STDERR: bytearray()}
        self.evbuf = bytearray()

r, w = os.pipe()
os.set_blocking(r, False)
os.write(w, b"0\\n1\\n")
h = Harness()
r_ = run.Run(h, "e", {"mode": p.MODE_INTERACTIVE})
child = Child(r)
lines = p.WARM_LINE
for i in range(2):
    lines += p.encode({"type": p.LOG, "level": "info", "message": str(i), "_o": 2 * (i + 1), "_e": 0})
r_._take_events(child, bytearray(lines))
print("".join(e["text"] if e["type"] == p.STDOUT else "|%s|" % e["message"] for e in h.out.lines if e["type"] in (p.STDOUT, p.LOG)), end="")
"""


class PlanModeTest(HarnessTest):
    REQUEST = {"mode": "plan"}

    def test_a_last_expression_is_a_result(self):
        events = self.execute("p", "6 * 7")
        self.assertEqual(of(events, "error"), [])
        self.assertEqual([e["data"] for e in of(events, "final_result")], [42])
        # One too large to send as a result still is one: its Out says it.
        events = self.execute("q", "'x' * 600_000")
        self.assertEqual((of(events, "error"), of(events, "final_result"), len(of(events, "execute_result"))), ([], [], 1))

    def test_no_result_is_an_error_that_says_what_to_do(self):
        events = self.execute("p", "print('hi')")
        self.assertEqual([(e["error"], e["hint"]) for e in of(events, "error")],
                         [("Script finished without a result (plan mode requires one)",
                           "End the script with an expression: its value is the result, as the last line of a notebook cell is shown. Or call emit_result(value).")])


class SessionCellsTest(unittest.TestCase):
    def test_calls_are_numbered_and_underscore_holds_the_last_value(self):
        h = HarnessProcess()
        self.addCleanup(h.close)
        got = []
        for i, script in enumerate(("10", "x = 1", "_ + 1", "_ = 'mine'\n5", "_")):
            h.send(type="execute", execution_id="s%d" % i, script=script, mode="interactive", session=True, nonce="n%d" % i)
            events = h.until("script_done")
            h.read()  # reset_done
            got.append([(e["execution_count"], e["data"]["text/plain"]) for e in of(events, "execute_result")])
        # The script's own _ is left alone, as IPython leaves it.
        self.assertEqual(got, [[(1, "10")], [], [(3, "11")], [(4, "5")], [(5, "'mine'")]])

    def test_a_session_keeps_its_event_loop_and_its_tasks(self):
        h = HarnessProcess()
        self.addCleanup(h.close)
        outs = []
        for i, script in enumerate(("import asyncio\nasync def f():\n    return 5\nt = asyncio.ensure_future(f())\nawait asyncio.sleep(0)", "await t")):
            h.send(type="execute", execution_id="a%d" % i, script=script, mode="interactive", session=True, nonce="n%d" % i)
            events = h.until("script_done")
            h.read()
            outs.append(([e["data"]["text/plain"] for e in of(events, "execute_result")], of(events, "error")))
        self.assertEqual(outs, [([], []), (["5"], [])])

    def test_a_session_process_that_exits_ends_the_call_in_an_error(self):
        h = HarnessProcess()
        self.addCleanup(h.close)
        h.send(type="execute", execution_id="x", script="import os\nos._exit(0)", mode="interactive", session=True, nonce="n")
        errors = [e["error"] for e in of(h.until("script_done"), "error")]
        self.assertEqual(errors, ["Script process exited with code 0, ending its session"])


class HintsTest(HarnessTest):
    REQUEST = {"mode": "interactive"}

    def error(self, script):
        errors = of(self.execute("h", script), "error")
        self.assertEqual(len(errors), 1)
        return errors[0]

    def test_a_missing_module_names_the_sandboxs_packages(self):
        e = self.error("import nonexistent_module_xyz")
        self.assertEqual(e["error"], "ModuleNotFoundError: No module named 'nonexistent_module_xyz'")
        self.assertIn("no module 'nonexistent_module_xyz', and none can be installed from a script (no pip, no network)", e["hint"])
        self.assertIn("It has, beside the standard library", e["hint"])

    def test_ipython_shell_escapes_and_magics_are_said_to_be_ipython(self):
        self.assertIn("`!pip` is IPython syntax (a shell command)", self.error("!pip install requests")["hint"])
        self.assertIn("`%timeit` is an IPython magic", self.error("%timeit 1+1")["hint"])
        self.assertIn("`%pip` is an IPython magic", self.error("%pip install x")["hint"])

    def test_matplotlib_inline_is_run_as_a_no_op(self):
        events = self.execute("m", "%matplotlib inline\nif True:\n    %matplotlib\n1 + 1")
        self.assertEqual(of(events, "error"), [])
        self.assertEqual([e["data"]["text/plain"] for e in of(events, "execute_result")], ["2"])

    def test_files_left_outside_out_are_said_not_to_come_back(self):
        events = self.execute("f", "import os\nos.makedirs('out')\nopen('out/ok.txt', 'w').write('x')\nopen('chart.png', 'w').write('x')\nos.makedirs('results')")
        warnings = [e["message"] for e in of(events, "log") if e["level"] == "warning"]
        self.assertEqual(len(warnings), 1, warnings)
        self.assertTrue(warnings[0].startswith("not returned: chart.png, results/, written outside "), warnings)

    def test_a_network_error_says_the_sandbox_has_no_network(self):
        script = "import sys; sys.path.insert(0, sys.argv[1])\nfrom jazzmine_harness import hints\nhints.install_network_hints()\nimport socket\ntry:\n    socket.getaddrinfo('nothing.invalid', 80)\nexcept socket.gaierror as e:\n    print(e)"
        env = dict(os.environ, JAZZMINE_SANDBOX="default", JAZZMINE_NETWORK_SANDBOXES="web (api.example.com)")
        out = subprocess.run([sys.executable, "-c", script, HARNESS_DIR], capture_output=True, text=True, env=env, timeout=60).stdout
        self.assertIn("(sandbox 'default' has no network access; sandboxes with network: web (api.example.com); send data in as input files instead)", out)


class UsageAndEntropyTest(unittest.TestCase):
    def test_script_done_says_what_the_execution_cost(self):
        h = HarnessProcess()
        self.addCleanup(h.close)
        h.send(type="execute", execution_id="u", script="x = sum(range(3_000_000))\nb = bytearray(64 << 20)", mode="interactive", nonce="n")
        done = h.until("script_done")[-1]
        self.assertGreater(done["cpu_ms"], 1)
        self.assertGreater(done["peak_memory_bytes"], 64 << 20)

    def test_a_generator_a_tool_made_at_import_draws_anew_in_every_execution(self):
        h = HarnessProcess(tools={"t.py": "import random\n_rng = random.Random()\ndef draw():\n    return _rng.getrandbits(64)\n"})
        self.addCleanup(h.close)
        draws = set()
        for i in range(4):
            h.send(type="execute", execution_id="g%d" % i, script="draw()", mode="interactive", nonce="n")
            draws.add(of(h.until("script_done"), "final_result")[0]["data"])
        self.assertEqual(len(draws), 4)

    def test_every_execution_has_a_multiprocessing_key_of_its_own(self):
        # A module seeded at import (here multiprocessing's authentication key) is seeded
        # again in every child; numpy's RandomState is the datascience sandbox's (a Go test).
        h = HarnessProcess(env={"JAZZMINE_PRELOAD": "multiprocessing"})
        self.addCleanup(h.close)
        keys = set()
        for i in range(4):
            h.send(type="execute", execution_id="k%d" % i, script="import multiprocessing, random\n(bytes(multiprocessing.current_process().authkey).hex(), random.random())", mode="interactive", nonce="n")
            events = h.until("script_done")
            keys.update(map(json.dumps, of(events, "final_result")[0]["data"]))
        self.assertEqual(len(keys), 8)


if __name__ == "__main__":
    unittest.main()
