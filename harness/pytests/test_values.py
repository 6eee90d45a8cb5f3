"""The JSON form of a script's values (values.form): one form for each kind of value,
or an error naming where in the value the part without one is."""

import collections
import dataclasses
import datetime
import decimal
import enum
import json
import unittest
import uuid

import harness_process  # noqa: F401 (puts the package on the path)
from jazzmine_harness import values


class FormTest(unittest.TestCase):
    def form(self, v, **kw):
        text, nonfinite = values.form(v, **kw)
        return json.loads(text), nonfinite

    def test_json_values_are_themselves(self):
        v = {"a": [1, 2.5, "x", None, True], "b": {"c": -3}}
        self.assertEqual(self.form(v), (v, []))

    def test_nonfinite_floats_are_null_and_their_places_listed(self):
        got = self.form({"x": float("nan"), "y": [1.5, float("inf"), {"z": float("-inf")}]})
        self.assertEqual(got, ({"x": None, "y": [1.5, None, {"z": None}]}, [[["x"], "nan"], [["y", 1], "inf"], [["y", 2, "z"], "-inf"]]))
        self.assertEqual(self.form(float("nan")), (None, [[[], "nan"]]))

    def test_lone_surrogates_become_their_escape_as_text(self):
        self.assertEqual(self.form({"k\udc80": "\ud800"}), ({"k\\udc80": "\\ud800"}, []))

    def test_ints_beyond_64_bits_are_their_digits(self):
        self.assertEqual(self.form([2**63 - 1, 2**64 - 1, 2**64, -(2**63), -(2**63) - 1]), ([2**63 - 1, 2**64 - 1, "18446744073709551616", -(2**63), "-9223372036854775809"], []))

    def test_keys_are_strings_as_json_dumps_makes_them(self):
        self.assertEqual(self.form({1: "a", 2.5: "b", False: "c", None: "d", (1, 2): "e"}), ({"1": "a", "2.5": "b", "false": "c", "null": "d", "(1, 2)": "e"}, []))

    def test_other_types_have_one_form_each(self):
        class Color(enum.Enum):
            RED = "red"

        @dataclasses.dataclass
        class Point:
            x: int
            y: float

        v = [b"hi\x00", bytearray(b"\xff"), {3, 1, 2}, frozenset(), (1, "a"), collections.deque([1]), datetime.date(2024, 5, 1), datetime.datetime(2024, 5, 1, 12, 0),
             datetime.timedelta(minutes=1, microseconds=500000), decimal.Decimal("1.10"), 1 + 2j, uuid.UUID(int=1), Color.RED, Point(1, float("nan"))]
        got, nonfinite = self.form(v)
        self.assertEqual(got, ["aGkA", "/w==", [1, 2, 3], [], [1, "a"], [1], "2024-05-01", "2024-05-01T12:00:00", 60.5, "1.10", "(1+2j)",
                               "00000000-0000-0000-0000-000000000001", "red", {"x": 1, "y": None}])
        self.assertEqual(nonfinite, [[[13, "y"], "nan"]])

    def test_nesting_past_the_limit_is_refused_naming_where(self):
        v = []
        for _ in range(values.MAX_DEPTH):
            v = [v]
        with self.assertRaises(values.NoJSONForm) as e:
            values.form({"k": v}, "emit_result data")
        self.assertTrue(str(e.exception).startswith("emit_result data['k'][0][0][0]...("), e.exception)
        ok = []
        for _ in range(values.MAX_DEPTH - 1):
            ok = [ok]
        self.assertEqual(self.form(ok)[0], ok)

    def test_an_object_without_a_form_is_refused_naming_its_path(self):
        class Thing:
            pass

        with self.assertRaises(values.NoJSONForm) as e:
            values.form({"a": [1, Thing()]}, "emit_result data")
        self.assertTrue(str(e.exception).startswith("emit_result data['a'][1]: a value of type test_values.FormTest.test_an_object_without_a_form_is_refused_naming_its_path.<locals>.Thing has no JSON form"), e.exception)
        self.assertIsInstance(e.exception, TypeError)

    def test_a_budget_bounds_the_form(self):
        with self.assertRaises(values.TooLarge):
            values.form(list(range(100000)), budget=1000)
        with self.assertRaises(values.TooLarge):
            values.form([float("nan")] * 10000, budget=1000)
        self.assertEqual(self.form([1], budget=1000), ([1], []))

    def test_a_replaced_json_dumps_does_not_change_the_form(self):
        real = json.dumps
        json.dumps = None
        try:
            self.assertEqual(values.form([1])[0], "[1]")
        finally:
            json.dumps = real


if __name__ == "__main__":
    unittest.main()
