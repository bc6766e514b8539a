"""The checks every config field goes through: a function per kind of value, each naming the field.

Every validator of the package (the run's sections, the mixers' and probes' arguments, the data
formats' fields, the bandit's parameters, the functions' arguments) checks its values with these,
so that one mistake reads the same wherever it is made: the field's full name, what it must be, and
the value given::

  >>> integer("train.num_steps", 0, minimum=1)
  Traceback (most recent call last):
  ValueError: train.num_steps must be >= 1, got 0

A ``bool`` is never a number here (``True`` would pass for 1), an ``int`` is a float where a number
is asked for, and a number must be finite unless said otherwise. Each returns the value as the
type asked for (a ``numpy`` integer comes back a Python ``int``). Every check takes ``hint``: a
sentence the message ends with, for what the bare rule does not say (where a bound comes from,
what to do instead)::

  >>> integer("cliff.min_source_history", 300, maximum=200, hint="at most cliff.window")
  Traceback (most recent call last):
  ValueError: cliff.min_source_history must be <= 200, got 300 (at most cliff.window)

Code that sorts values rather than refusing them (a record's numbers, a manifest's sizes) asks
:func:`is_integer` and :func:`is_number`, the same rule as a yes or no: no module writes
``isinstance(v, bool) or not isinstance(v, int)`` itself (``tests/test_layout.py``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

INT32_LIMIT = 2**31
"""Steps, counts and sizes travel as int32 inside the compiled step: they stay below this."""


def is_integer(value) -> bool:
  """Whether ``value`` is an integer as :func:`integer` takes one: an ``int`` or a ``numpy``
  integer, never a bool (whatever its value).

  Example: ``is_integer(np.int64(3)) and not is_integer(True) and not is_integer(3.0)``.
  """
  return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def is_number(value) -> bool:
  """Whether ``value`` is a number as :func:`number` takes one: an ``int``, a ``float`` or a
  ``numpy`` one, never a bool (whatever its value: NaN too).

  Example: ``is_number(2) and is_number(np.float32(0.5)) and not is_number(False)``.
  """
  return (isinstance(value, (int, float, np.integer, np.floating))
          and not isinstance(value, (bool, np.bool_)))


def _say(message: str, hint: str | None) -> str:
  return f"{message} ({hint})" if hint else message


def integer(where: str, value, *, minimum: int | None = None, maximum: int | None = None,
            int32: bool = True, optional: bool = False, hint: str | None = None) -> int | None:
  """``value`` as an ``int``: ``TypeError`` unless an integer (not a bool), ``ValueError`` below
  ``minimum``, above ``maximum`` or, with ``int32``, at or past ``2**31``. With ``optional``,
  ``None`` passes (and comes back ``None``).

  Example: ``integer("eval.every", 250, minimum=0) == 250``;
  ``integer("batch_size", None, minimum=1, optional=True) is None``.
  """
  if optional and value is None:
    return None
  if not is_integer(value):
    kind = "an integer or None" if optional else "an integer"
    raise TypeError(_say(f"{where} must be {kind}, got {value!r}", hint))
  value = int(value)
  if minimum is not None and value < minimum:
    raise ValueError(_say(f"{where} must be >= {minimum}, got {value}", hint))
  if maximum is not None and value > maximum:
    raise ValueError(_say(f"{where} must be <= {maximum}, got {value}", hint))
  if int32 and not -INT32_LIMIT <= value < INT32_LIMIT:
    raise ValueError(_say(f"{where} must be below 2**31 (an int32), got {value}", hint))
  return value


def number(where: str, value, *, low: float | None = None, high: float | None = None,
           low_open: bool = False, high_open: bool = False, finite: bool = True,
           optional: bool = False, hint: str | None = None) -> float | None:
  """``value`` as a ``float`` in the interval ``low .. high`` (closed ends unless ``*_open``):
  ``TypeError`` unless a number (not a bool), ``ValueError`` for NaN, an infinity (unless
  ``finite=False``) or a value outside. With ``optional``, ``None`` passes (and comes back
  ``None``).

  Example: ``number("optim.b1", 0.9, low=0, high=1, high_open=True) == 0.9``; the message of a
  value outside names the interval: ``optim.b1 must be in [0, 1), got 1.0``.
  """
  if optional and value is None:
    return None
  if not is_number(value):
    kind = "a number or None" if optional else "a number"
    raise TypeError(_say(f"{where} must be {kind}, got {value!r}", hint))
  value = float(value)
  if math.isnan(value) or (finite and math.isinf(value)):
    raise ValueError(_say(f"{where} must be finite, got {value}", hint))
  below = low is not None and (value <= low if low_open else value < low)
  above = high is not None and (value >= high if high_open else value > high)
  if below or above:
    raise ValueError(_say(f"{where} must be {_interval(low, high, low_open, high_open)}, "
                          f"got {value}", hint))
  return value


def _interval(low, high, low_open: bool, high_open: bool) -> str:
  if high is None:
    return f"{'>' if low_open else '>='} {low:g}"
  if low is None:
    return f"{'<' if high_open else '<='} {high:g}"
  return f"in {'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"


def flag(where: str, value, *, hint: str | None = None) -> bool:
  """``value`` as a ``bool``: ``TypeError`` unless ``True`` or ``False``."""
  if not isinstance(value, (bool, np.bool_)):
    raise TypeError(_say(f"{where} must be True or False, got {value!r}", hint))
  return bool(value)


def choice(where: str, value, options: Sequence[str], *, hint: str | None = None) -> str:
  """``value`` if it is one of ``options``, else a ``ValueError`` listing them."""
  if not isinstance(value, str) or value not in options:
    raise ValueError(_say(f"{where} must be one of {tuple(options)}, got {value!r}", hint))
  return value


def text(where: str, value, *, empty: bool = True, hint: str | None = None) -> str:
  """``value`` as a string: ``TypeError`` unless a ``str``, ``ValueError`` if empty and not
  ``empty``."""
  if not isinstance(value, str):
    raise TypeError(_say(f"{where} must be a string, got {value!r}", hint))
  if not empty and not value:
    raise ValueError(_say(f"{where} must not be empty", hint))
  return value


def satisfies(where: str, value, ok: Callable[[float], bool], what: str, *,
              hint: str | None = None) -> float:
  """A finite number ``value`` that ``ok`` accepts; else ``ValueError`` "``where`` must be
  ``what``, got ``value``" (for conditions an interval does not say, e.g. float32's range)."""
  value = number(where, value, hint=hint)
  if not ok(value):
    raise ValueError(_say(f"{where} must be {what}, got {value}", hint))
  return value
