"""Equal-compute scoring (``study/equal_compute.py``) against numbers worked out by hand."""

import math

import pytest

from study.equal_compute import NOT_REACHABLE, lower_envelope, steps_to_reach, worth


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


def test_the_lower_envelope_is_the_best_run_of_at_most_n_steps():
  assert lower_envelope([2.0, 1.8, 1.9, 1.7]) == [2.0, 1.8, 1.8, 1.7]
  assert lower_envelope([1.5, 1.6, 1.7]) == [1.5, 1.5, 1.5]


def test_a_baseline_that_ends_worse_is_read_on_its_envelope():
  # 1000 -> 1250 -> 1500 steps end at 2.0, 1.8, 1.9: the envelope is 2.0, 1.8, 1.8.
  steps, losses = [1000, 1250, 1500], [2.0, 1.8, 1.9]
  with pytest.raises(ValueError, match="must fall as its runs grow"):
    steps_to_reach(steps, losses, 1.9)
  # 1.9 is half way from 2.0 to 1.8: sqrt(1.25) x 1000 steps, never the 1500-step run's 1.9.
  n, rel = steps_to_reach(steps, losses, 1.9, envelope=True)
  assert rel == "=" and n == pytest.approx(1000 * 1.25 ** 0.5)
  # Exactly the best run's loss: its own length, the first of the flat stretch.
  assert steps_to_reach(steps, losses, 1.8, envelope=True) == (pytest.approx(1250.0), "=")
  # Below the best run, which is not the longest: no tested length reaches it.
  assert steps_to_reach(steps, losses, 1.75, envelope=True) == (1500.0, NOT_REACHABLE)
  assert steps_to_reach(steps, losses, 2.1, envelope=True) == (1000.0, "<")


def test_an_envelope_still_falling_at_its_end_gives_a_bound():
  # 2.0, 2.1, 1.9: the longest run is the best (below 2.0): a loss under it needs more steps.
  steps, losses = [1000, 1250, 1500], [2.0, 2.1, 1.9]
  assert steps_to_reach(steps, losses, 1.8, envelope=True) == (1500.0, ">")
  # 1.95 lies on the envelope's segment 1250 (2.0) -> 1500 (1.9), half way: sqrt(1.2) x 1250.
  n, rel = steps_to_reach(steps, losses, 1.95, envelope=True)
  assert rel == "=" and n == pytest.approx(1250 * 1.2 ** 0.5)
  # A monotone curve reads the same with or without the envelope.
  for loss in (2.05, 1.95, 1.85, 1.65):
    assert (steps_to_reach([1000, 1250, 1500], [2.0, 1.9, 1.7], loss, envelope=True)
            == steps_to_reach([1000, 1250, 1500], [2.0, 1.9, 1.7], loss))


def test_worth_of_a_loss_no_run_reaches_is_a_lower_bound():
  value, rel = worth([1000, 1250, 1500], [2.0, 1.8, 1.9], 1.7, 1000, overhead=0.25, envelope=True)
  assert rel == NOT_REACHABLE and value == pytest.approx(1500 / 1250)
