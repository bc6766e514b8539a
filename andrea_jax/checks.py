"""The checks every config field goes through: one function per kind of value, each naming the field.

Every validator of the package (the run's sections, the mixers' and probes' arguments, the data
formats' fields, the bandit's parameters) checks its values with these, so that one mistake reads
the same wherever it is made: the field's full name, what it must be, and the value given::

  >>> integer("train.num_steps", 0, minimum=1)
  Traceback (most recent call last):
  ValueError: train.num_steps must be >= 1, got 0

A ``bool`` is never a number here (``True`` would pass for 1), an ``int`` is a float where a number
is asked for, and a number must be finite unless said otherwise. Each returns the value as the
type asked for (a ``numpy`` integer comes back a Python ``int``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

INT32_LIMIT = 2**31
"""Steps, counts and sizes travel as int32 inside the compiled step: they stay below this."""


def integer(where: str, value, *, minimum: int | None = None, maximum: int | None = None,
            int32: bool = True) -> int:
  """``value`` as an ``int``: ``TypeError`` unless an integer (not a bool), ``ValueError`` below
  ``minimum``, above ``maximum`` or, with ``int32``, at or past ``2**31``.

  Example: ``integer("eval.every", 250, minimum=0) == 250``.
  """
  if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
    raise TypeError(f"{where} must be an integer, got {value!r}")
  value = int(value)
  if minimum is not None and value < minimum:
    raise ValueError(f"{where} must be >= {minimum}, got {value}")
  if maximum is not None and value > maximum:
    raise ValueError(f"{where} must be <= {maximum}, got {value}")
  if int32 and not -INT32_LIMIT <= value < INT32_LIMIT:
    raise ValueError(f"{where} must be below 2**31 (an int32), got {value}")
  return value


def number(where: str, value, *, low: float | None = None, high: float | None = None,
           low_open: bool = False, high_open: bool = False, finite: bool = True) -> float:
  """``value`` as a ``float`` in the interval ``low .. high`` (closed ends unless ``*_open``):
  ``TypeError`` unless a number (not a bool), ``ValueError`` for NaN, an infinity (unless
  ``finite=False``) or a value outside.

  Example: ``number("optim.b1", 0.9, low=0, high=1, high_open=True) == 0.9``; the message of a
  value outside names the interval: ``optim.b1 must be in [0, 1), got 1.0``.
  """
  if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer,
                                                                   np.floating)):
    raise TypeError(f"{where} must be a number, got {value!r}")
  value = float(value)
  if math.isnan(value) or (finite and math.isinf(value)):
    raise ValueError(f"{where} must be finite, got {value}")
  below = low is not None and (value <= low if low_open else value < low)
  above = high is not None and (value >= high if high_open else value > high)
  if below or above:
    raise ValueError(f"{where} must be {_interval(low, high, low_open, high_open)}, got {value}")
  return value


def _interval(low, high, low_open: bool, high_open: bool) -> str:
  if high is None:
    return f"{'>' if low_open else '>='} {low:g}"
  if low is None:
    return f"{'<' if high_open else '<='} {high:g}"
  return f"in {'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"


def flag(where: str, value) -> bool:
  """``value`` as a ``bool``: ``TypeError`` unless ``True`` or ``False``."""
  if not isinstance(value, (bool, np.bool_)):
    raise TypeError(f"{where} must be True or False, got {value!r}")
  return bool(value)


def choice(where: str, value, options: Sequence[str]) -> str:
  """``value`` if it is one of ``options``, else a ``ValueError`` listing them."""
  if not isinstance(value, str) or value not in options:
    raise ValueError(f"{where} must be one of {tuple(options)}, got {value!r}")
  return value


def text(where: str, value, *, empty: bool = True) -> str:
  """``value`` as a string: ``TypeError`` unless a ``str``, ``ValueError`` if empty and not
  ``empty``."""
  if not isinstance(value, str):
    raise TypeError(f"{where} must be a string, got {value!r}")
  if not empty and not value:
    raise ValueError(f"{where} must not be empty")
  return value


def satisfies(where: str, value, ok: Callable[[float], bool], what: str) -> float:
  """A finite number ``value`` that ``ok`` accepts; else ``ValueError`` "``where`` must be
  ``what``, got ``value``" (for conditions an interval does not say, e.g. float32's range)."""
  value = number(where, value)
  if not ok(value):
    raise ValueError(f"{where} must be {what}, got {value}")
  return value
