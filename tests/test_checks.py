"""``andrea_jax.checks``: what each check accepts, what it refuses, and the message it refuses with,
against messages written out here (the field's name, the rule, the value given)."""

import math
import re

import numpy as np
import pytest

from andrea_jax import checks


def _refused(error, message, fn, *args, **kwargs):
  """``fn(*args, **kwargs)`` raises exactly ``error`` with exactly ``message``."""
  with pytest.raises(error) as e:
    fn(*args, **kwargs)
  assert type(e.value) is error
  assert str(e.value) == message


# ---- integer ----

@pytest.mark.parametrize("value", [0, 7, -3, np.int64(3), np.int32(-2), np.uint8(200),
                                   2**31 - 1, -2**31])
def test_integer_accepts_ints_and_numpy_integers_as_python_ints(value):
  got = checks.integer("f", value)
  assert got == int(value) and type(got) is int


# A wrong type is shown as its repr (numpy's differs between 1.x and 2.x: np.True_, True).
@pytest.mark.parametrize("value, shown", [(True, "True"), (False, "False"),
                                          (np.bool_(True), repr(np.bool_(True))),
                                          (2.5, "2.5"), (3.0, "3.0"),
                                          (np.float64(1), repr(np.float64(1))),
                                          ("3", "'3'"), (None, "None"), ([1], "[1]")])
def test_integer_refuses_anything_but_an_integer_with_a_type_error(value, shown):
  _refused(TypeError, f"model.num_layers must be an integer, got {shown}",
           checks.integer, "model.num_layers", value)


def test_integer_bounds_are_inclusive_and_named():
  assert checks.integer("f", 1, minimum=1, maximum=3) == 1
  assert checks.integer("f", 3, minimum=1, maximum=3) == 3
  _refused(ValueError, "train.num_steps must be >= 1, got 0",
           checks.integer, "train.num_steps", 0, minimum=1)
  _refused(ValueError, "generate: max_new_tokens must be <= 3, got 4",
           checks.integer, "generate: max_new_tokens", 4, minimum=1, maximum=3)
  _refused(ValueError, "f must be >= 0, got -1", checks.integer, "f", np.int64(-1), minimum=0)


def test_integer_stays_an_int32_unless_told():
  _refused(ValueError, "f must be below 2**31 (an int32), got 2147483648",
           checks.integer, "f", 2**31)
  _refused(ValueError, "f must be below 2**31 (an int32), got -2147483649",
           checks.integer, "f", -2**31 - 1)
  assert checks.integer("f", 2**40, int32=False) == 2**40


def test_integer_optional_lets_none_through_and_says_so():
  assert checks.integer("batch_size", None, minimum=1, optional=True) is None
  assert checks.integer("batch_size", 4, minimum=1, optional=True) == 4
  _refused(TypeError, "batch_size must be an integer or None, got 2.5",
           checks.integer, "batch_size", 2.5, optional=True)
  _refused(TypeError, "batch_size must be an integer or None, got True",
           checks.integer, "batch_size", True, optional=True)
  _refused(ValueError, "batch_size must be >= 1, got 0",
           checks.integer, "batch_size", 0, minimum=1, optional=True)
  _refused(TypeError, "batch_size must be an integer, got None",
           checks.integer, "batch_size", None, minimum=1)


def test_integer_hint_ends_every_message():
  _refused(ValueError, "k must be <= 4, got 5 (min(num_iters, num_params))",
           checks.integer, "k", 5, maximum=4, hint="min(num_iters, num_params)")
  _refused(TypeError, "k must be an integer, got 'a' (min(num_iters, num_params))",
           checks.integer, "k", "a", hint="min(num_iters, num_params)")


# ---- number ----

@pytest.mark.parametrize("value", [0, 2, -1.5, 0.25, np.float32(0.5), np.float64(-2.0),
                                   np.int64(3), 1e300])
def test_number_accepts_ints_floats_and_numpy_numbers_as_python_floats(value):
  got = checks.number("f", value)
  assert got == float(value) and type(got) is float


@pytest.mark.parametrize("value, shown", [(True, "True"), (False, "False"),
                                          (np.bool_(False), repr(np.bool_(False))),
                                          ("1.0", "'1.0'"),
                                          (None, "None"), (1j, "1j"), ([0.5], "[0.5]")])
def test_number_refuses_bools_and_non_numbers_with_a_type_error(value, shown):
  _refused(TypeError, f"optim.peak_lr must be a number, got {shown}",
           checks.number, "optim.peak_lr", value)


def test_number_refuses_nan_always_and_infinity_unless_told():
  _refused(ValueError, "f must be finite, got nan", checks.number, "f", float("nan"))
  _refused(ValueError, "f must be finite, got nan", checks.number, "f", np.float32("nan"),
           finite=False)
  _refused(ValueError, "f must be finite, got inf", checks.number, "f", math.inf)
  _refused(ValueError, "f must be finite, got -inf", checks.number, "f", -np.inf)
  assert checks.number("f", math.inf, finite=False) == math.inf
  assert checks.number("f", math.inf, low=0, finite=False) == math.inf
  _refused(ValueError, "f must be >= 0, got -inf", checks.number, "f", -math.inf, low=0,
           finite=False)


# (low, high, low_open, high_open) -> the words of the interval; the values on each side.
_INTERVALS = [
    ((0, 1, False, False), "in [0, 1]", [0, 0.5, 1], [-0.1, 1.1]),
    ((0, 1, False, True), "in [0, 1)", [0, 0.5], [-0.1, 1]),
    ((0, 1, True, False), "in (0, 1]", [0.5, 1], [0, 1.5]),
    ((0, 1, True, True), "in (0, 1)", [0.5], [0, 1]),
    ((0.5, None, False, False), ">= 0.5", [0.5, 9], [0.25]),
    ((0.5, None, True, False), "> 0.5", [0.75], [0.5]),
    ((None, 2, False, False), "<= 2", [2, -9], [2.5]),
    ((None, 2, False, True), "< 2", [1.5], [2]),
    ((-1, 2.5, True, True), "in (-1, 2.5)", [0], [-1, 2.5]),
]


@pytest.mark.parametrize("bounds, words, inside, outside", _INTERVALS)
def test_number_interval_ends_and_their_wording(bounds, words, inside, outside):
  low, high, low_open, high_open = bounds
  kwargs = dict(low=low, high=high, low_open=low_open, high_open=high_open)
  for v in inside:
    assert checks.number("x", v, **kwargs) == v
  for v in outside:
    _refused(ValueError, f"x must be {words}, got {float(v)}", checks.number, "x", v, **kwargs)


def test_number_optional_and_hint():
  assert checks.number("top_p", None, low=0, optional=True) is None
  _refused(TypeError, "top_p must be a number or None, got 'a'",
           checks.number, "top_p", "a", optional=True)
  _refused(ValueError, "--temperature must be > 0, got 0.0 (--greedy takes the most probable "
           "token)", checks.number, "--temperature", 0, low=0, low_open=True,
           hint="--greedy takes the most probable token")


# ---- flag, choice, text, satisfies ----

def test_flag():
  assert checks.flag("train.plot", True) is True
  assert checks.flag("train.plot", np.bool_(False)) is False
  for value, shown in ((1, "1"), (0, "0"), ("yes", "'yes'"), (None, "None")):
    _refused(TypeError, f"train.plot must be True or False, got {shown}",
             checks.flag, "train.plot", value)
  _refused(TypeError, "cliff.respond must be True or False, got 1 (see docs)",
           checks.flag, "cliff.respond", 1, hint="see docs")


def test_choice():
  assert checks.choice("model.dtype", "bfloat16", ("float32", "bfloat16")) == "bfloat16"
  for value, shown in (("float16", "'float16'"), (None, "None"), (1, "1")):
    _refused(ValueError, f"model.dtype must be one of ('float32', 'bfloat16'), got {shown}",
             checks.choice, "model.dtype", value, ["float32", "bfloat16"])


def test_text():
  assert checks.text("init.from_hf", "") == ""
  assert checks.text("init.from_hf", "gpt2", empty=False) == "gpt2"
  _refused(TypeError, "init.from_hf must be a string, got 3 (a path, or '' for none)",
           checks.text, "init.from_hf", 3, hint="a path, or '' for none")
  _refused(ValueError, "data.tokenizer must not be empty", checks.text, "data.tokenizer", "",
           empty=False)


def test_satisfies():
  f32_max = float(np.finfo(np.float32).max)
  normal = lambda x: x <= f32_max
  assert checks.satisfies("lr", 1, normal, "float32") == 1.0
  _refused(ValueError, "lr must be within float32, got 1e+39",
           checks.satisfies, "lr", 1e39, normal, "within float32")
  _refused(TypeError, "lr must be a number, got True", checks.satisfies, "lr", True, normal, "x")
  _refused(ValueError, "lr must be finite, got nan", checks.satisfies, "lr", math.nan,
           lambda x: True, "x")
  _refused(ValueError, "lr must be within float32, got 1e+39 (the step's precision)",
           checks.satisfies, "lr", 1e39, normal, "within float32", hint="the step's precision")


# ---- the predicates ----

@pytest.mark.parametrize("value, integer, number", [
    (3, True, True), (np.int64(3), True, True), (np.uint16(3), True, True),
    (2.5, False, True), (np.float32(2.5), False, True), (math.nan, False, True),
    (math.inf, False, True), (True, False, False), (np.bool_(True), False, False),
    ("3", False, False), (None, False, False), (1j, False, False)])
def test_predicates_say_what_the_checks_take(value, integer, number):
  assert checks.is_integer(value) is integer
  assert checks.is_number(value) is number


def test_module_docstring_examples_hold():
  """The examples of the module's docstring, run."""
  with pytest.raises(ValueError, match=re.escape("train.num_steps must be >= 1, got 0")):
    checks.integer("train.num_steps", 0, minimum=1)
  with pytest.raises(ValueError, match=re.escape(
      "cliff.min_source_history must be <= 200, got 300 (at most cliff.window)")):
    checks.integer("cliff.min_source_history", 300, maximum=200, hint="at most cliff.window")
  assert checks.integer("eval.every", 250, minimum=0) == 250
  assert checks.number("optim.b1", 0.9, low=0, high=1, high_open=True) == 0.9
  with pytest.raises(ValueError, match=re.escape("optim.b1 must be in [0, 1), got 1.0")):
    checks.number("optim.b1", 1.0, low=0, high=1, high_open=True)
