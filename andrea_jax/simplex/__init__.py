"""The geometry of the curriculum: the region ``{l <= w <= u, sum w = 1}`` of the mixture simplex.

Pure, jit/vmap-compatible functions (bounds may be traced values):

* :func:`project` -- the exact, differentiable Euclidean projection onto the region;
* :func:`greedy_vertex` -- the vertex maximising a score (the bandit's UCB target);
* :func:`sample_uniform` -- uniform points of the region (the curriculum's random phases), with
  :func:`acceptance_probabilities` of its two rejection samplers;
* :func:`is_feasible` -- whether bounds leave a non-empty region.

And host-side: :class:`Region` (validated floors and ceilings by source name) and :func:`vertices`.
"""

from andrea_jax.simplex.projection import project
from andrea_jax.simplex.region import Region, is_feasible
from andrea_jax.simplex.sampling import SampleInfo, acceptance_probabilities, sample_uniform
from andrea_jax.simplex.vertex import greedy_vertex, vertices

__all__ = [
    "Region",
    "SampleInfo",
    "acceptance_probabilities",
    "greedy_vertex",
    "is_feasible",
    "project",
    "sample_uniform",
    "vertices",
]
