"""The curriculum: a walk on the mixture simplex, in phases, under a schedule of geometries.

The interface the trainer calls (all pure; ``update``, ``exclude`` and ``metrics`` are jittable)::

  spec = curriculum.spec_from_config(config.curriculum, sources=SOURCES)  # static, validated
  state = curriculum.init(spec, key)                                      # CurriculumState pytree
  state = curriculum.update(spec, state, step, losses_S, tokens_S, signals) # every step, in the step
  sched = curriculum.schedule(state)                                      # [2, S], starts [2]
  w_S = curriculum.weights_at(sched, step)                                # host-side lookup
  state = curriculum.exclude(spec, state, mask_S)                         # extra exclusions
  m = curriculum.metrics(spec, state)                                     # small arrays to log

Modules: :mod:`.geometries` (regions of the simplex as config entries, and their builders),
:mod:`.spec` (the ``curriculum`` section and its validation into a :class:`CurriculumSpec`),
:mod:`.engine` (phases and geometries), :mod:`.mixer` (the :class:`Mixer` interface, ANDREA's walk
and the static mixture), :mod:`.bandit` (the walk's discounted UCB bandit), :mod:`.rewards` (what
the bandit is rewarded by, by name), :mod:`.exp3` and :mod:`.elastic` (two baseline mixers),
:mod:`.registry` (mixers by name: the ``curriculum.mixer`` section from a factory's typed
arguments), :mod:`.mixture_file` (a fitted mixture schedule read from a JSON file),
:mod:`.simulate` (the curriculum against a synthetic reward model, in one ``lax.scan``),
:mod:`.plots`; ``python -m andrea_jax.curriculum`` runs the simulator.
"""

from andrea_jax.curriculum import bandit, rewards
from andrea_jax.curriculum.geometries import (
    andrea_geometries,
    full_simplex,
    geometry,
    single_geometry,
    three_regimes,
)
from andrea_jax.curriculum.spec import (
    MIXERS,
    CurriculumSpec,
    curriculum_config,
    set_mixer,
    spec_from_config,
    used_sources,
)
from andrea_jax.sources import source_key
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
from andrea_jax.curriculum.mixer import (
    REWARDS,
    WALK_LABELS,
    Decision,
    Mixer,
    Observation,
    SourceWeights,
    andrea_walk,
    bandit_only,
    random_only,
    restrict,
    static,
    walk,
)
from andrea_jax.curriculum.mixture_file import read_mixture_file, write_mixture_file
from andrea_jax.curriculum.registry import mixer_config

__all__ = [
    "MIXERS", "CurriculumSpec", "andrea_geometries", "curriculum_config", "full_simplex",
    "geometry", "set_mixer", "single_geometry", "source_key", "spec_from_config", "three_regimes",
    "used_sources",
    "CurriculumState", "Schedule", "exclude", "init", "lookup", "metrics", "schedule", "update",
    "weights_at",
    "REWARDS", "WALK_LABELS", "Decision", "Mixer", "Observation", "SourceWeights", "andrea_walk",
    "bandit_only", "random_only", "restrict", "static", "walk",
    "bandit", "rewards", "mixer_config", "read_mixture_file", "write_mixture_file",
]
