"""Prefetcher: step order, depth ahead, producer errors re-raised with the step, clean close."""

import time

import numpy as np
import pytest

from andrea_jax.data import Prefetcher


def _wait_until(predicate, timeout=5.0):
  deadline = time.monotonic() + timeout
  while not predicate() and time.monotonic() < deadline:
    time.sleep(0.005)
  return predicate()


def test_yields_steps_in_order_from_the_start_step():
  with Prefetcher(lambda s: {"x": np.full(3, s)}, start_step=7, end_step=12) as it:
    assert it.next_step == 7
    first = next(it)
    assert it.next_step == 8
    got = [first] + list(it)
  assert [int(b["x"][0]) for b in got] == [7, 8, 9, 10, 11]
  assert it.next_step == 12


def test_keeps_depth_batches_ready_and_no_more():
  made = []
  with Prefetcher(lambda s: made.append(s) or s, start_step=0, depth=3) as it:
    # Three batches wait in the queue, a fourth is built and blocks on the full queue.
    assert _wait_until(lambda: len(made) >= 4)
    time.sleep(0.05)
    assert made == [0, 1, 2, 3]
    assert next(it) == 0
    assert _wait_until(lambda: len(made) == 5)   # consuming one lets the producer make one more
    assert next(it) == 1


def test_producer_error_is_reraised_with_the_step_after_earlier_batches():
  def make(step):
    if step == 3:
      raise KeyError("no mixture for this step")
    return step

  it = Prefetcher(make, start_step=1)
  assert next(it) == 1 and next(it) == 2
  with pytest.raises(KeyError, match="no mixture") as info:
    next(it)
  assert any("step 3" in note for note in info.value.__notes__)
  with pytest.raises(StopIteration):
    next(it)
  it.close()


def test_close_stops_a_producer_blocked_on_a_full_queue():
  it = Prefetcher(lambda s: s, start_step=0, depth=1)
  assert _wait_until(lambda: it._queue.full())
  it.close()
  assert not it._thread.is_alive()
  with pytest.raises(StopIteration):
    next(it)


def test_arguments_are_checked():
  with pytest.raises(ValueError, match="depth"):
    Prefetcher(lambda s: s, 0, depth=0)
  with pytest.raises(ValueError, match="end_step 3 is before start_step 5"):
    Prefetcher(lambda s: s, 5, end_step=3)


def test_a_stop_iteration_from_make_batch_is_an_error_not_the_end():
  def make(step):
    if step == 2:
      raise StopIteration("data exhausted")
    return step

  it = Prefetcher(make, 0, end_step=10)
  assert [next(it), next(it)] == [0, 1]
  with pytest.raises(RuntimeError, match="make_batch raised StopIteration at step 2"):
    next(it)
  with pytest.raises(RuntimeError, match="at step 2"):
    list(Prefetcher(make, 0, end_step=10))   # a for loop does not end quietly at step 2
