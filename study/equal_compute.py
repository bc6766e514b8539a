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

**A baseline that ends worse with more steps** (a small target repeated past its useful epochs:
the longer run overfits it) has no inverse. By default it is refused. With ``envelope=True`` the
curve read is its *lower envelope*, ``E_k = min_{j <= k} L_j``: the best final loss of any run of
at most ``n_k`` steps (a practitioner with ``n_k`` steps of compute may always run the shorter
schedule). The envelope is flat where a longer run ended worse; a loss on a flat stretch is reached
at the stretch's first length. A loss below the envelope's last value is then one of two cases:

* ``">"``: the longest run is the envelope's minimum and lower than every shorter one (the curve
  still falls at its end): more steps than the longest, a bound;
* ``"not reachable"``: the baseline's best run is a shorter one and the longer runs ended worse:
  no tested length reaches the loss, and the curve gives no reason to think a longer one would.
  ``n`` is then the longest length (the loss is out of reach of every run up to it).

These live with the studies (not in ``andrea_jax``): only the studies' scoreboards use them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

NOT_REACHABLE = "not reachable"
"""The relation of a loss below a turned baseline's best run (module docstring)."""


def _checked(steps_K: Sequence[float], losses_K: Sequence[float], loss: float
             ) -> tuple[list[float], list[float]]:
  steps, losses = [float(n) for n in steps_K], [float(x) for x in losses_K]
  if len(steps) < 2 or len(steps) != len(losses):
    raise ValueError(f"steps_to_reach needs two or more lengths with one loss each, got "
                     f"{steps_K} and {losses_K}")
  if any(b <= a for a, b in zip(steps, steps[1:])):
    raise ValueError(f"the run lengths must increase, got {steps_K}")
  if not all(math.isfinite(x) for x in losses + [float(loss)]):
    raise ValueError(f"losses must be finite, got {losses_K} and {loss}")
  return steps, losses


def lower_envelope(losses_K: Sequence[float]) -> list[float]:
  """``E_k = min_{j <= k} L_j``: the best final loss of any run of at most the k-th length.

  Example:
    >>> lower_envelope([2.0, 1.8, 1.9, 1.7])
    [2.0, 1.8, 1.8, 1.7]
  """
  out, best = [], math.inf
  for x in losses_K:
    best = min(best, float(x))
    out.append(best)
  return out


def steps_to_reach(steps_K: Sequence[float], losses_K: Sequence[float], loss: float, *,
                   envelope: bool = False) -> tuple[float, str]:
  """``(n, relation)``: the steps of a baseline run whose final loss is ``loss``.

  ``relation`` is ``"="`` (interpolated in ``log n`` between the two runs that bracket ``loss``),
  ``"<"`` (``loss`` is above the shortest run's: fewer than ``steps_K[0]``; ``n`` is that bound),
  ``">"`` (below the longest run's: more than ``steps_K[-1]``) or, with ``envelope``,
  :data:`NOT_REACHABLE` (module docstring; ``n`` is ``steps_K[-1]``).

  Args:
    steps_K: the baseline's run lengths, increasing.
    losses_K: their final losses (e.g. means over seeds), one per length. Without ``envelope``
      they must decrease: a longer run that ends higher is refused. With it, the lower envelope
      (:func:`lower_envelope`) is read instead.
    loss: the loss to reach.
    envelope: read the lower envelope (a longer run that ends worse is allowed).

  Example:
    >>> steps_to_reach([1000, 2000], [2.0, 1.8], 1.9)    # half way in loss, sqrt(2) in steps
    (1414.2135623730956, '=')
    >>> steps_to_reach([1000, 2000], [2.0, 2.1], 1.9, envelope=True)
    (2000.0, 'not reachable')
  """
  steps, losses = _checked(steps_K, losses_K, loss)
  if envelope:
    curve = lower_envelope(losses)
  else:
    if any(b >= a for a, b in zip(losses, losses[1:])):
      raise ValueError(f"the baseline's final losses must fall as its runs grow, got {losses_K} "
                       f"for {steps_K}: more seeds, lengths further apart, or envelope=True")
    curve = losses
  if loss > curve[0]:
    return steps[0], "<"
  if loss < curve[-1]:
    still_falling = losses[-1] < curve[-2]
    return steps[-1], ">" if still_falling else NOT_REACHABLE
  if loss == curve[0]:
    return steps[0], "="
  for (n0, l0), (n1, l1) in zip(zip(steps, curve), zip(steps[1:], curve[1:])):
    if l1 <= loss < l0:    # l1 < l0 here: a flat stretch never brackets a loss below it
      return n0 * (n1 / n0) ** ((l0 - loss) / (l0 - l1)), "="
  raise AssertionError("unreachable: the loss is bracketed")


def worth(steps_K: Sequence[float], losses_K: Sequence[float], loss: float, steps: float,
          overhead: float = 0.0, *, envelope: bool = False) -> tuple[float, str]:
  """A run of ``steps`` steps costing ``overhead`` more per step than the baseline's, ending at
  ``loss``: ``(baseline steps to reach it / its own compute, relation)``. Above 1, the run is
  worth more than its compute in the baseline's steps. ``relation`` and ``envelope`` are
  :func:`steps_to_reach`'s (with :data:`NOT_REACHABLE` the value is a lower bound: not even the
  longest run reached the loss).

  Example:
    >>> worth([1000, 2000], [2.0, 1.8], 1.9, 1000, overhead=0.05)   # 1414 / 1050
    (1.3468700594029481, '=')
  """
  n, relation = steps_to_reach(steps_K, losses_K, loss, envelope=envelope)
  return n / (steps * (1.0 + overhead)), relation


def step_flops(config) -> float:
  """XLA's FLOPs count for one compiled training step of ``config`` (an ml-collections config),
  its probes' rows included, from shapes alone (nothing runs)."""
  import jax
  from andrea_jax import probes, runconfig, step as step_lib, train
  run = runconfig.build(config)
  state = jax.eval_shape(lambda: train.init_state(run, train.run_keys(0)))
  seq = config.data.seq_len
  spec = lambda n: {k: jax.ShapeDtypeStruct((n, seq), "int32") for k in
                    ("inputs", "targets", "segment_ids", "positions")} | {
                        "source_ids": jax.ShapeDtypeStruct((n,), "int32")}
  batch = spec(config.data.global_batch_size)
  for probe in run.step.probes:
    for group, n in probe.rows.items():
      batch |= {probes.rows_key(probe.name, group, k): v for k, v in spec(n).items()}
  compiled = jax.jit(lambda s, b: step_lib.train_step(run.step, s, b)).lower(state, batch).compile()
  cost = compiled.cost_analysis()
  return float((cost[0] if isinstance(cost, list) else cost)["flops"])
