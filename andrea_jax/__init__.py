"""andrea_jax: a JAX/Flax functional training system for ANDREA-120M.

In reading order, the way one training step goes through the package (the layers and a table of
where to change what: ``docs/architecture.md``):

* :mod:`andrea_jax.main` -- the command line: flags only, then
  :func:`andrea_jax.train.train_and_evaluate`.
* :mod:`andrea_jax.config` -- the base config, one commented field each; :mod:`andrea_jax.runconfig`
  validates it, once, into a typed ``Run`` (with :mod:`andrea_jax.checks` and
  :mod:`andrea_jax.plugins`): nothing below reads the ``ConfigDict``.
* :mod:`andrea_jax.train` -- the loop: set-up, resume, the steps, the end; its periodic work (the
  log, the evaluation, the checkpoint, the caller's own) are :mod:`andrea_jax.hooks`; the batches
  come from :mod:`andrea_jax.feed`, the records go through :mod:`andrea_jax.logs` and
  :mod:`andrea_jax.evaluate`, the workdir is :mod:`andrea_jax.rundir`, :mod:`andrea_jax.resume`
  and :mod:`andrea_jax.checkpoint`.
* :mod:`andrea_jax.step` -- the state and the one jitted step: the probes
  (:mod:`andrea_jax.probes`, the target gain among them), the loss (:mod:`andrea_jax.model`,
  :mod:`andrea_jax.attention`, :mod:`andrea_jax.xent`), the update (:mod:`andrea_jax.optim`), the
  curriculum and the zombie-cliff detector (:mod:`andrea_jax.cliff`).
* :mod:`andrea_jax.curriculum` -- the walk on the simplex: geometries, the engine, the mixers,
  their rewards and bandit; :mod:`andrea_jax.simplex` -- the region, its exact differentiable
  projection, the UCB vertex, uniform sampling.
* :mod:`andrea_jax.data` -- formats, tokenizers, prepared shards, the built-in corpora and the
  mixture sampler.
* Around a run: :mod:`andrea_jax.pretrained` (start from GPT-2 or another run),
  :mod:`andrea_jax.sample`, :mod:`andrea_jax.export`, :mod:`andrea_jax.harness`
  (lm-evaluation-harness), :mod:`andrea_jax.convert`; diagnostics: :mod:`andrea_jax.terrain`
  (basin width), :mod:`andrea_jax.ablation` (vmapped variants), :mod:`andrea_jax.heads`.

Each component imports on its own: the attention, the model, the simplex ops, the bandit and the
mixers, the schedules.
"""

from andrea_jax.sources import SOURCES, WARMUP_SOURCES, NUM_SOURCES

__version__ = "0.1.0"
__all__ = ["SOURCES", "WARMUP_SOURCES", "NUM_SOURCES", "__version__"]
