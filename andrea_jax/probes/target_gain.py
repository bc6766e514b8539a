r"""The target gain: how fast a step on each source lowers the loss on the run's declared target.

A run that declares a target (``eval.target``: a mixture of its sources whose held-out loss is
what the run is for) can reward its curriculum's bandit by what each source does *for the target*
rather than by each source's progress on itself (``curriculum.mixer.reward = "target_gain"``). The
target gain is the first of the run's probes (:mod:`andrea_jax.probes`): the signal
``target_gain``, logged as ``target_gain/<source>``.

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

**The measurement.** At the steps ``t`` with ``(t + 1) % every == 0`` (the first after
``every - 1`` updates, and with ``every`` dividing ``train.log_every`` each log record carries the
gains), the step computes, at the weights it starts from: ``g_T``, the gradient of the mean loss
on ``target_rows`` rows drawn from the target mixture; then all the ``a_s`` at once, the derivative
of the vector of per-source mean losses on ``rows_per_source`` rows of each source along
``P g_T`` (forward mode: no per-source gradient is ever formed). Only the sources some geometry
lets the run sample are measured (a source the run only evaluates, ``eval.untrained``, gets NaN,
so it never weighs in the bandit's reward scale). Cost: a forward and backward pass over
``target_rows`` rows and about two forward passes over ``rows_per_source x sources`` rows per
measurement (``lax.cond``: nothing on the other steps); ``python -m bench.target_gain`` measures it.

**Where the rows come from.** Both batches come from the data through the run's sampler, on
streams of their own, never the evaluation's fixed windows. The probe rows come from each source's
training split. The target rows come from ``target_split``:

* ``"train"`` (default): the target sources' training split. For a target the run also trains on,
  these are rows of the documents it is learning, so the gain cannot see the target being
  memorised; for a target in ``eval.untrained`` (a dev set the run never trains on) they are rows
  the run never sees: the clean way to steer toward a small target.
* ``"eval"``: the target sources' held-out documents, the ones ``eval/target_loss`` is measured
  on (at other positions): the gain sees memorisation, but the score is then no longer held out
  from the mixture's choices; a separate dev source in ``eval.untrained`` keeps it so.

The config section (``probes.target_gain``)::

  name = "target_gain"   # this probe
  every = 0              # steps between measurements; 0 = none (the reward "target_gain" needs > 0)
  rows_per_source = 2    # probe rows of each source per measurement
  target_rows = 8        # rows drawn from eval.target's mixture per measurement
  precondition = True    # along Adam's preconditioned target gradient (False: the plain gradient)
  target_split = "train" # where the target rows come from: "train" or "eval" (held-out documents)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from andrea_jax import checks
from andrea_jax.probes.interface import At, Probe, ProbeContext, ProbeEnv

PyTree = Any
Batch = dict[str, jax.Array]

SPLITS = ("train", "eval")
"""Where the target rows may come from: the target's training split or its held-out documents."""
# Streams of the run's sampler for the two row groups: other seeds than the training batches'.
_PROBE_SALT, _TARGET_SALT = 0x5EED_9B0BE, 0x5EED_7A26E7


def probe(env: ProbeEnv, *, every: int = 0, rows_per_source: int = 2, target_rows: int = 8,
          precondition: bool = True, target_split: str = "train") -> Probe | None:
  """The target-gain probe of a run (``None`` when ``every`` is 0: nothing measured).

  Args:
    env: the run (:class:`andrea_jax.probes.ProbeEnv`): its sources, the trainable ones (the only
      ones measured), the target, Adam's ``eps`` and ``b2``, the devices.
    every: steps between measurements (0 = none).
    rows_per_source: probe rows of each measured source per measurement (``[S]`` gains from one
      forward-mode product over all of them).
    target_rows: rows of the target mixture per measurement.
    precondition: along ``P g_T`` (Adam's bias-corrected preconditioner) rather than ``g_T``.
    target_split: ``"train"`` or ``"eval"``: the split the target rows come from (module
      docstring).

  Errors name ``probes.<name>.<field>`` and the value.

  Example:
    >>> p = probe(env, every=4)        # measured at steps 3, 7, 11, ...
    >>> dict(p.rows)                   # with 3 trainable sources
    {'probe': 6, 'target': 8}
  """
  where = env.where
  every = checks.integer(f"{where}.every", every, minimum=0)
  rows_per_source = checks.integer(f"{where}.rows_per_source", rows_per_source, minimum=1)
  target_rows = checks.integer(f"{where}.target_rows", target_rows, minimum=1)
  precondition = checks.flag(f"{where}.precondition", precondition)
  checks.choice(f"{where}.target_split", target_split, SPLITS)
  if every == 0:
    return None
  if env.target is None:
    raise ValueError(f"{where}.every = {every} measures the gains toward the run's target, and "
                     "eval.target is not set: give eval.target.<source> weights")
  measured_S = np.asarray(env.trainable, np.float64)
  rows = {"probe": rows_per_source * int(measured_S.sum()), "target": target_rows}
  for group, name in (("target", "target_rows"), ("probe", "rows_per_source x sources")):
    if rows[group] % env.devices:
      raise ValueError(f"{where}.{name} = {rows[group]} rows is not a multiple of the "
                       f"{env.devices} devices the rows are split over")
  uniform_S, target_S = measured_S / measured_S.sum(), np.asarray(env.target, np.float64)
  eps, b2 = float(env.optim.eps), float(env.optim.b2)

  def draw(make_sampler):
    probes = make_sampler(global_batch_size=rows["probe"], salt=_PROBE_SALT)
    target = make_sampler(global_batch_size=target_rows, salt=_TARGET_SALT, split=target_split)
    return lambda step: {"probe": probes.batch(step, uniform_S),
                         "target": target.batch(step, target_S)}

  def measure(ctx: ProbeContext, at: At, groups) -> jax.Array:
    probe_rows, target_rows_ = groups["probe"], groups["target"]

    def source_losses(params):
      loss_BxT, counted_BxT = ctx.forward_token_losses(params, probe_rows)
      return ctx.per_source(loss_BxT, counted_BxT, probe_rows["source_ids"])

    def target_loss(params):
      loss_BxT, counted_BxT = ctx.token_losses(params, target_rows_)
      return loss_BxT.sum() / jnp.maximum(counted_BxT.sum(), 1.0)

    p = preconditioner(at.opt_state, at.params, eps, b2) if precondition else None
    return gains(source_losses, target_loss, at.params, p)

  return Probe(every=every, rows=rows, draw=draw, measure=measure)


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
