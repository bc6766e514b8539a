"""The study's own mixers, written against the package's interface (:mod:`andrea_jax.curriculum.mixer`).

``andrea_log_rate`` is ANDREA's walk with its bandit phases ranking the sources by the elastic
mixer's log-time learning rate instead of the UCB index of the per-token learning progress (sources
whose rate is not known yet first): the reward definition changed, the walk unchanged. A run names
it ``curriculum.mixer.name = "study.mixing.mixers:andrea_log_rate"``; its arguments are the walk's
``eta`` and ``random_share`` and the elastic mixer's ``uniform_mix``, ``burn_in`` and ``forget``.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from andrea_jax.curriculum import WALK_LABELS, Decision, Mixer, Observation, walk
from andrea_jax.curriculum import elastic as elastic_lib


def rate_scores(state: elastic_lib.ElasticState) -> jax.Array:
  """Scores ``[S]`` from the log-time learning rates: the rate where known, above every known
  rate where not (an unknown source is explored first, like the UCB index's optimism)."""
  r_S = elastic_lib.rates(state)
  known = elastic_lib.known(state)
  top = jnp.max(jnp.where(known, r_S, 0.0))
  return jnp.where(known, r_S, jnp.abs(top) + 1.0)


class _State(NamedTuple):
  elastic: elastic_lib.ElasticState


def andrea_log_rate(*, eta: float = 0.3, random_share: float = 0.25, uniform_mix: float = 0.5,
                    burn_in: int = 100, forget: float = 1.0) -> Mixer:
  """ANDREA's walk scored by :func:`rate_scores` (see the module docstring)."""
  params = elastic_lib.ElasticParams(uniform_mix=uniform_mix, burn_in=burn_in, forget=forget)
  eta, share = float(eta), float(random_share)

  def observe(state: _State, obs: Observation) -> _State:
    return _State(elastic_lib.observe(params, state.elastic, obs.step, obs.losses_S,
                                      obs.tokens_S))

  def decide(state: _State, d: Decision):
    weights_S, kind = walk(d, rate_scores(state.elastic), eta, share)
    return weights_S, kind, state

  return Mixer(init=lambda num_sources: _State(elastic_lib.init(num_sources)), observe=observe,
               decide=decide, metrics=lambda state: {"log_rate": elastic_lib.rates(state.elastic)},
               labels=WALK_LABELS)
