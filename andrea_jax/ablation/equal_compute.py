r"""Equal-compute scoring: how many steps a baseline needs, on its own schedule, to reach a loss.

Comparing a mixing strategy with a baseline at one run length flatters neither honestly: a
strategy that reaches the baseline's final loss "at step 600" of the baseline's 1000-step curve has
not saved 40% of the compute, because the baseline's curve at step 600 is still at its peak
learning rate. The fair question is how long a baseline run must be, with its warmup and decay laid
out over that length, to end at the strategy's final loss. Train the baseline at a few lengths
``n_1 < ... < n_K`` (e.g. 1x, 1.25x, 1.5x, 2x a run), each on its own schedule, and interpolate its
final loss against ``log n``:

.. math::
   n^*(L) = n_k \left(\frac{n_{k+1}}{n_k}\right)^{(L_k - L) / (L_k - L_{k+1})}
   \quad \text{for } L_{k+1} \le L \le L_k .

A loss above the shortest run's or below the longest run's is out of range: the answer is a bound
(``"<"`` the shortest, ``">"`` the longest), never an extrapolation. ``n^*(L) / n`` against the
strategy's own compute ``n (1 + overhead)`` says what the strategy is worth in the baseline's steps.
"""

from __future__ import annotations

import math
from collections.abc import Sequence


def steps_to_reach(steps_K: Sequence[float], losses_K: Sequence[float], loss: float
                   ) -> tuple[float, str]:
  """``(n, relation)``: the steps of a baseline run whose final loss is ``loss``.

  ``relation`` is ``"="`` (interpolated in ``log n`` between the two runs that bracket ``loss``),
  ``"<"`` (``loss`` is above the shortest run's: fewer than ``steps_K[0]``; ``n`` is that bound) or
  ``">"`` (below the longest run's: more than ``steps_K[-1]``).

  Args:
    steps_K: the baseline's run lengths, increasing.
    losses_K: their final losses (e.g. means over seeds), one per length. They must decrease: a
      longer run that ends higher says the baseline's runs are too noisy to score against, and is
      refused.
    loss: the loss to reach.

  Example:
    >>> steps_to_reach([1000, 2000], [2.0, 1.8], 1.9)    # half way in loss, sqrt(2) in steps
    (1414.2135623730956, '=')
  """
  steps, losses = [float(n) for n in steps_K], [float(x) for x in losses_K]
  if len(steps) < 2 or len(steps) != len(losses):
    raise ValueError(f"steps_to_reach needs two or more lengths with one loss each, got "
                     f"{steps_K} and {losses_K}")
  if any(b <= a for a, b in zip(steps, steps[1:])):
    raise ValueError(f"the run lengths must increase, got {steps_K}")
  if not all(math.isfinite(x) for x in losses + [float(loss)]):
    raise ValueError(f"losses must be finite, got {losses_K} and {loss}")
  if any(b >= a for a, b in zip(losses, losses[1:])):
    raise ValueError(f"the baseline's final losses must fall as its runs grow, got {losses_K} "
                     f"for {steps_K}: more seeds, or lengths further apart")
  if loss > losses[0]:
    return steps[0], "<"
  if loss < losses[-1]:
    return steps[-1], ">"
  for (n0, l0), (n1, l1) in zip(zip(steps, losses), zip(steps[1:], losses[1:])):
    if l1 <= loss <= l0:
      return n0 * (n1 / n0) ** ((l0 - loss) / (l0 - l1)), "="
  raise AssertionError("unreachable: the loss is bracketed")


def worth(steps_K: Sequence[float], losses_K: Sequence[float], loss: float, steps: float,
          overhead: float = 0.0) -> tuple[float, str]:
  """A run of ``steps`` steps costing ``overhead`` more per step than the baseline's, ending at
  ``loss``: ``(baseline steps to reach it / its own compute, relation)``. Above 1, the run is
  worth more than its compute in the baseline's steps.

  Example:
    >>> worth([1000, 2000], [2.0, 1.8], 1.9, 1000, overhead=0.05)   # 1414 / 1050
    (1.3468700594029481, '=')
  """
  n, relation = steps_to_reach(steps_K, losses_K, loss)
  return n / (steps * (1.0 + overhead)), relation
