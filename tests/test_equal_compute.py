"""Equal-compute scoring against numbers worked out by hand."""

import math

import pytest

from andrea_jax.ablation import steps_to_reach, worth


def test_interpolation_is_linear_in_log_steps():
  # 1000 -> 2000 steps, loss 2.0 -> 1.8: a quarter of the way down is 2^(1/4) x 1000 steps.
  n, rel = steps_to_reach([1000, 2000], [2.0, 1.8], 1.95)
  assert rel == "=" and n == pytest.approx(1000 * 2 ** 0.25)
  # Four lengths: the bracketing pair decides (1250 -> 1500, 1.9 -> 1.8, at 1.82: 0.8 of the way).
  n, rel = steps_to_reach([1000, 1250, 1500, 2000], [2.0, 1.9, 1.8, 1.7], 1.82)
  assert rel == "=" and n == pytest.approx(1250 * 1.2 ** 0.8)
  assert steps_to_reach([1000, 1250], [2.0, 1.9], 2.0) == (1000.0, "=")
  assert steps_to_reach([1000, 1250], [2.0, 1.9], 1.9) == (1250.0, "=")


def test_out_of_range_is_a_bound_not_an_extrapolation():
  assert steps_to_reach([1000, 2000], [2.0, 1.8], 2.1) == (1000.0, "<")
  assert steps_to_reach([1000, 2000], [2.0, 1.8], 1.7) == (2000.0, ">")


def test_worth_divides_by_the_runs_own_compute():
  value, rel = worth([1000, 2000], [2.0, 1.8], 1.9, 1000, overhead=0.05)
  assert rel == "=" and value == pytest.approx(math.sqrt(2) * 1000 / 1050)


@pytest.mark.parametrize("steps, losses, message", [
    ([1000], [2.0], "two or more lengths"),
    ([1000, 1000], [2.0, 1.9], "must increase"),
    ([1000, 2000], [1.9, 2.0], "must fall as its runs grow"),
    ([1000, 2000], [2.0, math.nan], "must be finite"),
])
def test_bad_baselines_are_refused(steps, losses, message):
  with pytest.raises(ValueError, match=message):
    steps_to_reach(steps, losses, 1.95)
