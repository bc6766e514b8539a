"""The curriculum engine: a walk on the mixture simplex, in phases, under a schedule of geometries.

The interface the trainer calls (all pure; ``update``, ``exclude`` and ``metrics`` are jittable)::

  spec = curriculum.spec_from_config(config.curriculum, sources=SOURCES)  # static, validated
  state = curriculum.init(spec, key)                                      # CurriculumState pytree
  state = curriculum.update(spec, state, step, losses_S, tokens_S)        # every step, in the step
  sched = curriculum.schedule(state)                                      # [2, S], starts [2]
  w_S = curriculum.weights_at(sched, step)                                # host-side numpy lookup
  state = curriculum.exclude(spec, state, mask_S)                         # extra exclusions
  m = curriculum.metrics(spec, state)                                     # small arrays to log

Strategies (``curriculum.strategy``): ``"andrea"`` (random and bandit phases), ``"bandit_only"``,
``"random_only"``, ``"static"`` (the uniform mixture projected onto each region), ``"exp3"`` (ODM's
online data mixing: EXP3 on the per-source training loss, projected onto each region) and
``"elastic"`` (shares in proportion to each source's log-time learning rate, projected).

Modules: :mod:`.config` (the config section, geometry builders, validation into a
:class:`CurriculumSpec`), :mod:`.engine` (phases and geometries), :mod:`.exp3` (the EXP3 mixer's
pure functions), :mod:`.elastic` (the elastic mixer's), :mod:`.proxy` (a mixture schedule fitted
on designed probe runs of a small proxy model), :mod:`.simulate` (the curriculum against a synthetic reward model, in one
``lax.scan``), :mod:`.plots`; ``python -m andrea_jax.curriculum`` runs the simulator.
"""

from andrea_jax.curriculum.config import (
    BANDIT_REWARDS,
    STRATEGIES,
    CurriculumSpec,
    andrea_geometries,
    bandit_section,
    curriculum_config,
    elastic_section,
    exp3_section,
    geometry,
    single_geometry,
    source_key,
    spec_from_config,
    used_sources,
    validate,
)
from andrea_jax.curriculum.engine import (
    KIND_BANDIT,
    KIND_ELASTIC,
    KIND_EXP3,
    KIND_FIXED,
    KIND_NAMES,
    KIND_RANDOM,
    CurriculumState,
    Schedule,
    exclude,
    init,
    lookup,
    metrics,
    schedule,
    update,
    weights_at,
)

__all__ = [
    "BANDIT_REWARDS", "STRATEGIES", "CurriculumSpec", "andrea_geometries", "bandit_section",
    "curriculum_config", "elastic_section", "exp3_section", "geometry", "single_geometry", "source_key", "spec_from_config",
    "used_sources", "validate",
    "KIND_BANDIT", "KIND_ELASTIC", "KIND_EXP3", "KIND_FIXED", "KIND_NAMES", "KIND_RANDOM", "CurriculumState",
    "Schedule", "exclude", "init", "lookup", "metrics", "schedule", "update", "weights_at",
]
