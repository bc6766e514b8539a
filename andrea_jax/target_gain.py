r"""The target gain: how fast a step on each source lowers the loss on the run's declared target.

A run that declares a target (``eval.target``: a mixture of its sources whose held-out loss is
what the run is for) can reward its curriculum's bandit by what each source does *for the target*
rather than by each source's progress on itself (``curriculum.mixer.reward = "target_gain"``).

**The quantity.** With ``L_T`` the loss on the target mixture and ``L_s`` source ``s``'s loss, an
optimizer step on ``s`` alone moves the weights by ``-lr P grad L_s`` (``P`` the optimizer's
diagonal preconditioner: ``1 / (sqrt(nu) + eps)`` for Adam's second moments ``nu``), and changes
the target loss, to first order, by

.. math::
   \Delta L_T \approx -\mathrm{lr}\, \langle \nabla L_T,\ P \nabla L_s \rangle
   = -\mathrm{lr}\, a_s, \qquad a_s = \langle P \nabla L_T,\ \nabla L_s \rangle .

``a_s`` is the target gain of ``s`` (nats per unit step; positive: a step on ``s`` lowers the
target loss). It is DoGE's gradient alignment (Fan et al., 2023, "DoGE: Domain Reweighting with
Generalization Estimation") with Adam's preconditioner, the first-order effect of the step the run
actually takes. ``precondition = False`` takes the plain gradient (an SGD step). Adam's ``nu`` is
bias-corrected (``nu / (1 - b2^t)`` after ``t`` updates), as the update uses it, so that gains
measured early and late in a run are on one scale; before the first update there are no second
moments and nothing is measured (NaN).

**The measurement.** At the steps ``t`` with ``(t + 1) % every == 0`` (:func:`is_measured`: the
first after ``every - 1`` updates, and with ``every`` dividing ``train.log_every`` each log record
carries the gains), the step computes, at the weights it starts from:
``g_T``, the gradient of the mean loss on ``target_rows`` rows drawn from the target mixture; then
all the ``a_s`` at once, the derivative of the vector of per-source mean losses on
``rows_per_source`` rows of each source along ``P g_T`` (forward mode: no per-source gradient is
ever formed). Both batches come from the training split through the run's sampler, on streams of
their own: rows the step does not train on, never the evaluation's held-out windows. Cost: a
forward and backward pass over ``target_rows`` rows and about two forward passes over
``rows_per_source x sources`` rows per measurement (``lax.cond``: nothing on the other steps);
``python -m bench.target_gain`` measures it. A source the run never samples gets NaN (not
measured).

The config section (``target_gain``)::

  every = 0              # steps between measurements; 0 = none (the reward "target_gain" needs > 0)
  rows_per_source = 2    # probe rows of each source per measurement
  target_rows = 8        # rows drawn from eval.target's mixture per measurement
  precondition = True    # along Adam's preconditioned target gradient (False: the plain gradient)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

PyTree = Any
Batch = dict[str, jax.Array]

PROBE = "probe/"
"""Key prefix of the probe rows in a training batch (``probe/inputs``, ...)."""
TARGET = "target/"
"""Key prefix of the target rows in a training batch (``target/inputs``, ...)."""
# Streams of the run's sampler for the two batches: other seeds than the training batches'.
_PROBE_SALT, _TARGET_SALT = 0x5EED_9B0BE, 0x5EED_7A26E7


def target_gain_config() -> ml_collections.ConfigDict:
  """The ``target_gain`` section (off by default)."""
  t = ml_collections.ConfigDict()
  # steps between measurements of each source's target gain (0 = never; the bandit's reward
  # "target_gain" needs > 0 and eval.target)
  t.every = 0
  t.rows_per_source = 2   # rows of each source per measurement (sequences of data.seq_len)
  t.target_rows = 8       # rows drawn from eval.target's mixture per measurement
  t.precondition = True   # along Adam's preconditioned target gradient; False = plain gradient
  return t


@dataclasses.dataclass(frozen=True)
class TargetGain:
  """The validated measurement: when, on how many rows, along which direction.

  Attributes:
    every: steps between measurements (> 0).
    rows_per_source: probe rows of each measured source.
    target_rows: rows of the target mixture.
    precondition: along ``P g_T`` (Adam's preconditioner) rather than ``g_T``.
    eps: Adam's epsilon (``optim.eps``), in ``P``.
    b2: Adam's second-moment decay (``optim.b2``), for ``nu``'s bias correction.
    measured: ``[S]`` bool as a tuple, the sources measured (those the run samples).
  """
  every: int
  rows_per_source: int
  target_rows: int
  precondition: bool
  eps: float
  b2: float
  measured: tuple[bool, ...]

  @property
  def probe_rows(self) -> int:
    return self.rows_per_source * sum(self.measured)


def from_config(cfg: ml_collections.ConfigDict, *, sources: tuple[str, ...],
                used: tuple[str, ...], target: tuple[float, ...] | None, eps: float,
                b2: float, devices: int) -> TargetGain | None:
  """The ``target_gain`` section validated (``None`` when ``every`` is 0); errors name the field.

  ``target`` is ``eval.target`` normalised (``None``: no target, refused when measuring);
  ``eps`` and ``b2`` Adam's (``optim``); ``devices`` the devices the rows are split over (both row
  counts must be multiples of it).
  """
  for name in ("every", "rows_per_source", "target_rows"):
    v = cfg[name]
    if isinstance(v, bool) or not isinstance(v, int) or v < (0 if name == "every" else 1):
      raise ValueError(f"target_gain.{name} must be an integer >= {0 if name == 'every' else 1}, "
                       f"got {v!r}")
  if not isinstance(cfg.precondition, bool):
    raise TypeError(f"target_gain.precondition must be True or False, got {cfg.precondition!r}")
  if cfg.every == 0:
    return None
  if target is None:
    raise ValueError(f"target_gain.every = {cfg.every} measures the gains toward the run's target, "
                     "and eval.target is not set: give eval.target.<source> weights")
  measured = tuple(s in used for s in sources)
  spec = TargetGain(every=cfg.every, rows_per_source=cfg.rows_per_source,
                    target_rows=cfg.target_rows, precondition=cfg.precondition, eps=float(eps),
                    b2=float(b2), measured=measured)
  for name, rows in (("target_rows", spec.target_rows),
                     ("rows_per_source x sources", spec.probe_rows)):
    if rows % devices:
      raise ValueError(f"target_gain.{name} = {rows} rows is not a multiple of the {devices} "
                       "devices the rows are split over")
  return spec


def is_measured(step, every: int):
  """Whether step ``step`` (an int or a traced int) measures the gains: ``(step + 1) % every == 0``.

  Example: ``[t for t in range(12) if is_measured(t, 4)] == [3, 7, 11]``.
  """
  return (step + 1) % every == 0


def preconditioner(opt_state: PyTree, params: PyTree, eps: float, b2: float) -> PyTree:
  """``1 / (sqrt(nu / (1 - b2^t)) + eps)`` from the Adam second moments ``nu`` after ``t`` updates
  in ``opt_state`` (``params``' tree): the bias-corrected denominator of Adam's update. NaN before
  the first update (``t = 0``: no second moments yet); ones when the optimizer holds none."""
  found = [s for s in jax.tree.leaves(
      opt_state, is_leaf=lambda x: isinstance(x, optax.ScaleByAdamState))
           if isinstance(s, optax.ScaleByAdamState)]
  if not found:
    return jax.tree.map(jnp.ones_like, params)
  t = found[0].count.astype(jnp.float32)
  correction = jnp.where(t > 0, 1.0 - jnp.float32(b2) ** t, jnp.nan)
  return jax.tree.map(lambda nu: 1.0 / (jnp.sqrt(nu / correction) + eps), found[0].nu)


def gains(source_losses: Callable[[PyTree], tuple[jax.Array, jax.Array]],
          target_loss: Callable[[PyTree], jax.Array], params: PyTree,
          precondition: PyTree | None = None) -> jax.Array:
  """The target gains ``a_s = <P grad L_T, grad L_s>``, ``[S]`` float32 (NaN: not measured).

  ``grad L_T`` by reverse mode; then every ``<d, grad L_s>`` at once, as the directional
  derivative of the vector of per-source losses along ``d = P grad L_T`` (one ``jax.jvp``: about
  two forward passes over the probe rows, whatever the number of sources).

  Args:
    source_losses: ``params -> (mean loss per source [S], tokens per source [S])`` on the probe
      rows (forward-differentiable: no ``custom_vjp`` inside, e.g. XLA attention).
    target_loss: ``params -> mean loss`` on the target rows.
    params: the weights to measure at.
    precondition: ``P`` (a tree like ``params``), or ``None`` for the identity.

  Example (quadratics worked by hand in tests/test_target_gain.py):
    >>> P = preconditioner(opt_state, params, eps=1e-8, b2=0.95)
    >>> a_S = gains(source_losses, target_loss, params, P)
  """
  g_T = jax.grad(target_loss)(params)
  d = g_T if precondition is None else jax.tree.map(jnp.multiply, precondition, g_T)
  (_, tokens_S), (a_S, _) = jax.jvp(source_losses, (params,), (d,))
  return jnp.where(tokens_S > 0, a_S, jnp.nan).astype(jnp.float32)


def split(batch: Batch) -> tuple[Batch, Batch | None, Batch | None]:
  """A training batch's own rows, its probe rows and its target rows (``None``: none)."""
  own = {k: v for k, v in batch.items() if not k.startswith((PROBE, TARGET))}
  probe = {k[len(PROBE):]: v for k, v in batch.items() if k.startswith(PROBE)}
  target = {k[len(TARGET):]: v for k, v in batch.items() if k.startswith(TARGET)}
  return own, probe or None, target or None


class ProbeBatches:
  """Host side: the probe and target rows of step ``t`` (at a measurement step,
  :func:`is_measured`; zero rows, which count nothing, at the others), for this process's slice. A
  pure function of ``(seed, t)``.

  ``make(data, seq_len, seed, process_index, process_count)`` builds a
  :class:`andrea_jax.data.MixtureSampler`; the two samplers draw from streams of their own.
  """

  def __init__(self, spec: TargetGain, target_S: np.ndarray, make_sampler: Callable[..., Any],
               seed: int, process_index: int = 0, process_count: int = 1):
    self.spec = spec
    seeds = (int(seed) ^ _PROBE_SALT, int(seed) ^ _TARGET_SALT)
    self._probe = make_sampler(global_batch_size=spec.probe_rows, seed=seeds[0],
                               process_index=process_index, process_count=process_count)
    self._target = make_sampler(global_batch_size=spec.target_rows, seed=seeds[1],
                                process_index=process_index, process_count=process_count)
    measured = np.asarray(spec.measured, np.float64)
    self._uniform_S = measured / measured.sum()
    self._target_S = np.asarray(target_S, np.float64)
    self._zeros = None

  def rows(self, step: int) -> dict[str, np.ndarray]:
    """``probe/...`` and ``target/...`` arrays of step ``step``, this process's rows."""
    if not is_measured(step, self.spec.every):
      if self._zeros is None:
        self._zeros = {k: np.zeros_like(v) for k, v in self._rows(0).items()}
      return self._zeros
    return self._rows(step)

  def _rows(self, step: int) -> dict[str, np.ndarray]:
    probe = self._probe.batch(step, self._uniform_S)
    target = self._target.batch(step, self._target_S)
    return {**{PROBE + k: v for k, v in probe.items()},
            **{TARGET + k: v for k, v in target.items()}}
