r"""The study's own mixer: DoGE/DGA-style multiplicative weights on the target gains.

``dga`` reads the target-gain probe's signal (``obs.signals["target_gain"]``, ``[S]``, NaN where
not measured; :mod:`andrea_jax.probes.target_gain`) and moves the mixture toward the sources whose
steps lower the target's loss, as DoGE (Fan et al., 2023) and Dynamic Gradient Alignment (Fan,
Grangier, Ablin, 2024) do with their gradient alignments. It separates "online gain-driven mixing"
from ANDREA's walk (its UCB bandit over the region's vertices and its random phases) on the same
signal. Its constants are the design's, fixed before any run and never tuned.

At each phase decision, with ``a_s`` the mean gain of source ``s`` over the measurements since the
previous decision (the sources of the region that were measured), and ``m = median_s |a_s|``:

.. math::
   z_s \leftarrow z_s + a_s / m, \qquad
   w \leftarrow (1 - \mathrm{step})\, w + \mathrm{step}\, \mathrm{softmax}_{\mathcal R}(z), \qquad
   w \leftarrow (1 - \mathrm{floor})\, w + \mathrm{floor}\, u_{\mathcal R}

(``w`` the current mixture, ``softmax_R`` over the region's sources, ``u_R`` uniform on them;
``step = 0.3``, ``floor = 0.05``: every source of the region keeps at least ``floor / K`` of the
batch). Dividing by the median makes the update scale-free (gains shrink as the run goes on); a
window with no measurement, or gains all zero, leaves ``z`` as it was. The first phase is uniform.

A run names it ``curriculum.mixer.name = "study.data_constrained.mixers:dga"`` with
``probes.target_gain.every > 0`` (the run refuses it otherwise: it declares the signal).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from andrea_jax import checks
from andrea_jax.curriculum import Decision, Mixer, Observation

SIGNAL = "target_gain"


class DgaState(NamedTuple):
  """``[S]`` float32 each: the logits ``z``, and the open window's sum and count of measured
  gains."""
  logits_S: jax.Array
  gain_sum_S: jax.Array
  gain_count_S: jax.Array


def init(num_sources: int) -> DgaState:
  z = lambda: jnp.zeros((num_sources,), jnp.float32)   # one buffer per field: the state is donated
  return DgaState(z(), z(), z())


def observe(state: DgaState, obs: Observation) -> DgaState:
  """Adds the step's measured gains (NaN = not measured) to the open window."""
  g_S = jnp.asarray(obs.signals[SIGNAL], jnp.float32)
  measured_S = jnp.isfinite(g_S)
  return state._replace(gain_sum_S=state.gain_sum_S + jnp.where(measured_S, g_S, 0.0),
                        gain_count_S=state.gain_count_S + measured_S.astype(jnp.float32))


def update(state: DgaState, current_S: jax.Array, upper_S: jax.Array, step: float, floor: float
           ) -> tuple[jax.Array, DgaState]:
  """One decision (module docstring): ``(weights [S], state with the window closed)``."""
  allowed_S = upper_S > 0
  measured_S = allowed_S & (state.gain_count_S > 0)
  a_S = jnp.where(measured_S, state.gain_sum_S / jnp.maximum(state.gain_count_S, 1.0), 0.0)
  m = jnp.nanmedian(jnp.where(measured_S, jnp.abs(a_S), jnp.nan))
  ok = jnp.any(measured_S) & jnp.isfinite(m) & (m > 0)
  logits_S = state.logits_S + jnp.where(ok & measured_S, a_S / jnp.where(ok, m, 1.0), 0.0)
  p_S = jax.nn.softmax(jnp.where(allowed_S, logits_S, -jnp.inf))
  uniform_S = allowed_S / jnp.maximum(jnp.sum(allowed_S), 1)
  w_S = (1 - step) * current_S + step * p_S
  w_S = (1 - floor) * w_S + floor * uniform_S
  zeros_S = jnp.zeros_like(state.gain_sum_S)
  return w_S.astype(jnp.float32), DgaState(logits_S, zeros_S, zeros_S)


def dga(*, step: float = 0.3, floor: float = 0.05) -> Mixer:
  """The multiplicative-weights mixer on the target gains (module docstring).

  Args:
    step: the share of the way from the current mixture to ``softmax(z)`` at each decision.
    floor: the share of the uniform mixture over the region mixed in after.

  Example:
    >>> mixer = dga()          # curriculum.mixer.name = "study.data_constrained.mixers:dga"
    >>> mixer.signals
    ('target_gain',)
  """
  step = checks.number("step", step, low=0, high=1)
  floor = checks.number("floor", floor, low=0, high=1)

  def decide(state: DgaState, d: Decision):
    w_S, state = update(state, d.current_S, d.upper_S, step, floor)
    return w_S, "dga", state

  return Mixer(init=init, observe=observe, decide=decide,
               metrics=lambda state: {"dga_logits": state.logits_S}, labels=("dga",),
               signals=(SIGNAL,))
