"""Autoregressive sampling with a KV cache.

The prompt goes through the model once (``decode=True`` fills the ``'cache'`` collection: keys and
values ``[B, max_len, H, Dh]`` per layer and the write index), then each new token costs one
single-position forward that reads the cache. The loop is a ``lax.scan``, so the whole call is
jittable with ``max_new_tokens``, ``top_k`` and ``greedy`` static.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from andrea_jax.model import ModelConfig, PyTree, Transformer


def init_cache(config: ModelConfig, batch_size: int) -> PyTree:
  """An empty KV cache for ``batch_size`` sequences: zeros of the shapes ``decode=True`` creates."""
  model = Transformer(config)
  tokens_Bx1 = jnp.zeros((batch_size, 1), jnp.int32)
  shapes = jax.eval_shape(
      lambda: model.init(jax.random.key(0), tokens_Bx1, decode=True))["cache"]
  return jax.tree_util.tree_map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)


def sample_logits(logits_BxV: jax.Array, key: jax.Array, *, temperature: float = 1.0,
                  top_k: int | None = None, greedy: bool = False) -> jax.Array:
  """Draws one token id per row ``[B]`` from ``softmax(logits / temperature)``.

  ``greedy`` takes the argmax; ``top_k`` restricts the draw to the ``k`` largest logits (the draw is
  then ``softmax(top_k_logits / temperature)`` over exactly those ids).

  Example:
    >>> sample_logits(jnp.array([[0., 5., 1.]]), key, top_k=1)   # [1]
  """
  if greedy:
    return jnp.argmax(logits_BxV, axis=-1).astype(jnp.int32)
  logits_BxV = logits_BxV.astype(jnp.float32) / temperature
  if top_k is None:
    return jax.random.categorical(key, logits_BxV, axis=-1).astype(jnp.int32)
  top_BxK, ids_BxK = jax.lax.top_k(logits_BxV, top_k)
  choice_B = jax.random.categorical(key, top_BxK, axis=-1)
  return jnp.take_along_axis(ids_BxK, choice_B[:, None], axis=-1)[:, 0].astype(jnp.int32)


def generate(params: PyTree, config: ModelConfig, prompt_BxP: jax.Array, key: jax.Array, *,
             max_new_tokens: int, temperature: float = 1.0, top_k: int | None = None,
             greedy: bool = False) -> jax.Array:
  """Continues each prompt by ``max_new_tokens`` sampled tokens; returns ``[B, P + N]`` int32.

  All prompts have the same length ``P`` (no left padding) and ``P + N <= config.max_len``. New
  token ``i`` is drawn with the ``i``-th key of ``jax.random.split(key, N)``: the same key gives the
  same tokens. Greedy decoding equals repeated argmax of the full (uncached) forward pass.

  Jittable: ``jax.jit(generate, static_argnames=("max_new_tokens", "top_k", "greedy"))``.

  Example:
    >>> out = generate(params, tiny(), prompt_BxP, jax.random.key(0), max_new_tokens=32, top_k=40)
  """
  B, P = prompt_BxP.shape
  if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 0:
    raise ValueError(f"max_new_tokens must be a non-negative int; got {max_new_tokens!r}")
  if P < 1:
    raise ValueError(f"prompt must hold at least one token; got shape {prompt_BxP.shape}")
  if P + max_new_tokens > config.max_len:
    raise ValueError(f"prompt length {P} + max_new_tokens {max_new_tokens} exceeds "
                     f"config.max_len={config.max_len}")
  if top_k is not None and not 1 <= top_k <= config.vocab_size:
    raise ValueError(f"top_k must be in [1, {config.vocab_size}]; got {top_k!r}")
  if isinstance(temperature, (int, float)) and not temperature > 0:
    raise ValueError(f"temperature must be > 0; got {temperature!r}")
  prompt_BxP = jnp.asarray(prompt_BxP, jnp.int32)
  if max_new_tokens == 0:
    return prompt_BxP

  model = Transformer(config)

  def forward(cache, tokens_BxT):
    logits_BxTxV, state = model.apply({"params": params, "cache": cache}, tokens_BxT,
                                      decode=True, mutable=["cache"])
    return state["cache"], logits_BxTxV[:, -1]

  def sample(logits_BxV, step_key):
    return sample_logits(logits_BxV, step_key, temperature=temperature, top_k=top_k,
                         greedy=greedy)

  def step(carry, step_key):
    cache, logits_BxV = carry
    token_B = sample(logits_BxV, step_key)
    cache, logits_BxV = forward(cache, token_B[:, None])
    return (cache, logits_BxV), token_B

  keys = jax.random.split(key, max_new_tokens)
  cache, logits_BxV = forward(init_cache(config, B), prompt_BxP)
  # The last token needs no forward pass after it: scan N - 1 steps, then draw it.
  (_, logits_BxV), tokens_NmxB = jax.lax.scan(step, (cache, logits_BxV), keys[:-1])
  last_B = sample(logits_BxV, keys[-1])
  new_BxN = jnp.concatenate([tokens_NmxB.T, last_B[:, None]], axis=1)
  return jnp.concatenate([prompt_BxP, new_BxN], axis=1)
