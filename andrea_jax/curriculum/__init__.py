"""The curriculum: a walk on the mixture simplex, in phases, under a schedule of geometries.

The interface the trainer calls (all pure; ``update``, ``exclude`` and ``metrics`` are jittable)::

  spec = curriculum.spec_from_config(config.curriculum, sources=SOURCES)  # static, validated
  state = curriculum.init(spec, key)                                      # CurriculumState pytree
  state = curriculum.update(spec, state, step, losses_S, tokens_S)        # every step, in the step
  sched = curriculum.schedule(state)                                      # [2, S], starts [2]
  w_S = curriculum.weights_at(sched, step)                                # host-side lookup
  state = curriculum.exclude(spec, state, mask_S)                         # extra exclusions
  m = curriculum.metrics(spec, state)                                     # small arrays to log

Modules: :mod:`.config` (the config section, geometry builders, validation into a
:class:`CurriculumSpec`), :mod:`.engine` (phases and geometries), :mod:`.mixer` (the
:class:`Mixer` interface, ANDREA's walk and the static mixture), :mod:`.exp3` and :mod:`.elastic`
(two baseline mixers), :mod:`.mixture_file` (a fitted mixture schedule read from a JSON file),
:mod:`.simulate` (the curriculum against a synthetic reward model, in one ``lax.scan``),
:mod:`.plots`; ``python -m andrea_jax.curriculum`` runs the simulator.
"""

from andrea_jax.curriculum.config import (
    STRATEGIES,
    CurriculumSpec,
    andrea_geometries,
    bandit_section,
    curriculum_config,
    elastic_section,
    exp3_section,
    full_simplex,
    geometry,
    single_geometry,
    source_key,
    spec_from_config,
    three_regimes,
    used_sources,
    validate,
)
from andrea_jax.curriculum.engine import (
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
from andrea_jax.curriculum.mixture_file import read_mixture_file, write_mixture_file
from andrea_jax.curriculum.mixer import (
    KIND_BANDIT,
    KIND_CUSTOM,
    KIND_ELASTIC,
    KIND_EXP3,
    KIND_FIXED,
    KIND_NAMES,
    KIND_RANDOM,
    Decision,
    Mixer,
    Observation,
    andrea_walk,
    static,
    walk,
)

__all__ = [
    "STRATEGIES", "CurriculumSpec", "andrea_geometries", "bandit_section", "curriculum_config",
    "elastic_section", "exp3_section", "full_simplex", "geometry", "single_geometry", "source_key",
    "spec_from_config", "three_regimes", "used_sources", "validate",
    "CurriculumState", "Schedule", "exclude", "init", "lookup", "metrics", "schedule", "update",
    "weights_at",
    "KIND_BANDIT", "KIND_CUSTOM", "KIND_ELASTIC", "KIND_EXP3", "KIND_FIXED", "KIND_NAMES",
    "KIND_RANDOM", "Decision", "Mixer", "Observation", "andrea_walk", "static", "walk",
    "read_mixture_file", "write_mixture_file",
]
