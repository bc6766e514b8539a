"""Ablations in one compiled program: ``K`` variants of a model, vmapped, on the same batches.

* :mod:`~andrea_jax.ablation.variants` -- what may vary (seed, warmup, peak rate, init scale);
* :mod:`~andrea_jax.ablation.engine` -- :func:`train_variants` (one ``jit(scan(vmap(step)))``
  program) and :func:`loop_baseline` (the variants one after the other with the normal step);
* :mod:`~andrea_jax.ablation.result` -- :class:`AblationResult`: loss curves ``[K, N]``, held-out
  loss per source ``[K, E, S]``, final parameters, samples and repetition scores.

(Equal-compute scoring, what a run is worth in the steps of a baseline trained at several lengths,
is the studies' own: ``study/equal_compute.py``.)

Example (the warmup ablation of the source document, scaled down)::

  from andrea_jax import ablation
  variants = [{"seed": s, "warmup_steps": w} for w in (0, 50) for s in range(4)]
  res = ablation.train_variants(config, variants, 500, eval_every=100)
  print(res.table())
"""

from andrea_jax.ablation.engine import (VariantState, default_mixture, init_variants, loop_baseline,
                                        make_optimizer, train_variants, variant_step)
from andrea_jax.ablation.result import AblationResult, generate_samples
from andrea_jax.ablation.variants import VARIANT_FIELDS, Variant, resolve_variants, run_config

__all__ = [
    "AblationResult", "VARIANT_FIELDS", "Variant", "VariantState", "default_mixture",
    "generate_samples", "init_variants", "loop_baseline", "make_optimizer", "resolve_variants",
    "run_config", "train_variants", "variant_step",
]
