"""The study's own mixers, written against the package's interface (:mod:`andrea_jax.curriculum.mixer`).

``andrea_log_rate`` is ANDREA's walk with its bandit phases ranking the sources by the elastic
mixer's log-time learning rate instead of the UCB index of the per-token learning progress (sources
whose rate is not known yet first): the reward definition changed, the walk unchanged. A run names
it ``curriculum.strategy = "study.mixing.mixers:andrea_log_rate"``; it reads ``curriculum.eta``,
``curriculum.random_share`` and the ``curriculum.elastic`` section.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import ml_collections

from andrea_jax.curriculum import Decision, Mixer, Observation, walk
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


def andrea_log_rate(section: ml_collections.ConfigDict) -> Mixer:
  """ANDREA's walk scored by :func:`rate_scores` (see the module docstring)."""
  params = elastic_lib.ElasticParams(**dict(section.elastic))
  eta, share = float(section.eta), float(section.random_share)

  def observe(state: _State, obs: Observation) -> _State:
    return _State(elastic_lib.observe(params, state.elastic, obs.step, obs.losses_S,
                                      obs.tokens_S))

  def decide(state: _State, d: Decision):
    weights_S, kind = walk(d, rate_scores(state.elastic), eta, share)
    return weights_S, kind, state

  return Mixer(init=lambda num_sources: _State(elastic_lib.init(num_sources)), observe=observe,
               decide=decide, metrics=lambda state: {"log_rate": elastic_lib.rates(state.elastic)})
