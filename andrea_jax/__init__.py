"""andrea_jax: a JAX/Flax functional training system for ANDREA-120M.

Components, each usable on its own (see the README for the full API):

* :mod:`andrea_jax.attention` -- scaled dot-product attention and causal/padding/document masks.
* :mod:`andrea_jax.model` -- the GPT-2-style decoder (``ModelConfig``, ``Transformer``).
* :mod:`andrea_jax.simplex` -- the accessible region of the mixture simplex, its exact differentiable
  projection, the UCB vertex and uniform sampling.
* :mod:`andrea_jax.curriculum` -- the curriculum engine, its mixers and their bandit.
* :mod:`andrea_jax.data` -- tokenizers, prepared shards, the built-in corpus and the mixture sampler.
* :mod:`andrea_jax.train` -- the jitted training step and ``train_and_evaluate``.
"""

from andrea_jax.sources import SOURCES, WARMUP_SOURCES, NUM_SOURCES

__version__ = "0.1.0"
__all__ = ["SOURCES", "WARMUP_SOURCES", "NUM_SOURCES", "__version__"]
