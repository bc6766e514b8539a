"""Autoregressive sampling with a KV cache.

The prompt goes through the model once (``decode=True`` fills the ``'cache'`` collection: keys and
values ``[B, max_len, H, Dh]`` per layer and the write index), then each new token costs one
single-position forward that reads the cache. The loop is a ``lax.scan``, so the whole call is
jittable with ``max_new_tokens``, ``top_k``, ``top_p`` and ``greedy`` static.

Filters, in the order ``transformers`` applies them: the temperature, then ``top_k`` (the ``k``
largest logits), then ``top_p`` (nucleus sampling: the smallest set of most probable ids whose
probability, renormalised over what ``top_k`` left, reaches ``p``).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from andrea_jax import checks
from andrea_jax.model import ModelConfig, PyTree, Transformer


def init_cache(config: ModelConfig, batch_size: int) -> PyTree:
  """An empty KV cache for ``batch_size`` sequences: zeros of the shapes ``decode=True`` creates."""
  model = Transformer(config)
  tokens_Bx1 = jnp.zeros((batch_size, 1), jnp.int32)
  shapes = jax.eval_shape(
      lambda: model.init(jax.random.key(0), tokens_Bx1, decode=True))["cache"]
  return jax.tree_util.tree_map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)


def _check_temperature(temperature) -> None:
  """``ValueError`` unless a concrete ``temperature`` is a finite number > 0 (a traced one is
  checked inside: see :func:`sample_logits`)."""
  if isinstance(temperature, jax.core.Tracer):
    return
  t = np.asarray(temperature)
  if t.size != 1 or not np.issubdtype(t.dtype, np.number) or not (np.isfinite(t) and t > 0):
    raise ValueError(f"temperature must be a finite number > 0; got {temperature!r}")


def check_top_p(top_p) -> float | None:
  """``top_p`` as the sampler uses it: ``None`` (off) for ``None`` or ``1.0``, else a float in
  ``(0, 1)``; ``TypeError``/``ValueError`` naming the value otherwise (it is static under
  ``jit``)."""
  top_p = checks.number("top_p", top_p, low=0, high=1, low_open=True, optional=True)
  return None if top_p == 1.0 else top_p


def nucleus_mask(sorted_logits_BxK: jax.Array, top_p: float) -> jax.Array:
  """``[B, K]`` bool: which of the descending-sorted logits nucleus sampling keeps.

  With ``p_i = softmax(sorted_logits)_i``, id ``i`` is kept when the mass before it,
  ``sum_{j < i} p_j``, is below ``top_p``: the smallest prefix whose mass reaches ``top_p``
  (``transformers``' ``TopPLogitsWarper``, which removes the least probable ids while their mass
  stays within ``1 - top_p``). The most probable id is always kept.

  Example:
    >>> nucleus_mask(jnp.log(jnp.array([[0.5, 0.3, 0.2]])), 0.7)   # [[True, True, False]]
  """
  p_BxK = jax.nn.softmax(sorted_logits_BxK.astype(jnp.float32), axis=-1)
  before_BxK = jnp.cumsum(p_BxK, axis=-1) - p_BxK
  return before_BxK < top_p


def sample_logits(logits_BxV: jax.Array, key: jax.Array, *, temperature: float = 1.0,
                  top_k: int | None = None, greedy: bool = False,
                  top_p: float | None = None) -> jax.Array:
  """Draws one token id per row ``[B]`` from ``softmax(logits / temperature)``.

  ``greedy`` takes the argmax; ``top_k`` restricts the draw to the ``k`` largest logits (the draw is
  then ``softmax(top_k_logits / temperature)`` over exactly those ids); ``top_p`` in ``(0, 1)``
  restricts it further to the nucleus (:func:`nucleus_mask`: the fewest most probable ids, after
  the temperature and ``top_k``, whose renormalised mass reaches ``top_p``), and the draw is the
  softmax over those ids alone. ``top_p`` of ``None`` or ``1.0`` is off (the draw is the same as
  without it, bit for bit). A concrete temperature that is not a finite number > 0 raises
  ``ValueError``; a traced one (inside ``jit``) cannot, and gives the id ``-1``, which no
  vocabulary holds, rather than a plausible token.

  Example:
    >>> sample_logits(jnp.array([[0., 5., 1.]]), key, top_k=1)   # [1]
    >>> sample_logits(jnp.log(jnp.array([[0.5, 0.3, 0.2]])), key, top_p=0.7)   # 0 or 1, 5:3
  """
  if greedy:
    return jnp.argmax(logits_BxV, axis=-1).astype(jnp.int32)
  _check_temperature(temperature)
  top_p = check_top_p(top_p)
  t = jnp.asarray(temperature, jnp.float32)
  valid = jnp.isfinite(t) & (t > 0)
  logits_BxV = logits_BxV.astype(jnp.float32) / jnp.where(valid, t, 1.0)
  if top_k is None and top_p is None:
    ids_B = jax.random.categorical(key, logits_BxV, axis=-1).astype(jnp.int32)
  else:
    # Sorted descending: the k largest (every id when top_k is off, for the nucleus's cumsum).
    top_BxK, ids_BxK = jax.lax.top_k(logits_BxV, logits_BxV.shape[-1] if top_k is None else top_k)
    if top_p is not None:
      top_BxK = jnp.where(nucleus_mask(top_BxK, top_p), top_BxK, -jnp.inf)
    choice_B = jax.random.categorical(key, top_BxK, axis=-1)
    ids_B = jnp.take_along_axis(ids_BxK, choice_B[:, None], axis=-1)[:, 0].astype(jnp.int32)
  return jnp.where(valid, ids_B, -1)


def generate(params: PyTree, config: ModelConfig, prompt_BxP: jax.Array, key: jax.Array, *,
             max_new_tokens: int, temperature: float = 1.0, top_k: int | None = None,
             greedy: bool | tuple[bool, ...] = False, vocab_limit: int | None = None,
             top_p: float | None = None) -> jax.Array:
  """Continues each prompt by ``max_new_tokens`` sampled tokens; returns ``[B, P + N]`` int32.

  All prompts have the same length ``P`` (no left padding) and ``P + N <= config.max_len``. New
  token ``i`` is drawn with the ``i``-th key of ``jax.random.split(key, N)``: the same key gives the
  same tokens. Greedy decoding equals repeated argmax of the full (uncached) forward pass.
  ``greedy`` may also be one bool per row: those rows decode greedily and the others are drawn
  together, as a call with only them would draw them (one program for both kinds of sample).

  ``top_p`` keeps the nucleus of each draw (:func:`sample_logits`; ``None`` and ``1.0`` are off).
  ``vocab_limit`` draws only ids below it: a model whose vocabulary is larger than its tokenizer's
  (ANDREA-120M's 50,257 rows with the byte tokenizer) never emits an id the tokenizer cannot
  decode.

  Jittable: ``jax.jit(generate, static_argnames=("max_new_tokens", "top_k", "greedy",
  "vocab_limit", "top_p"))``. Concrete
  bad input raises ``ValueError`` naming it (a prompt id outside the vocabulary, a temperature
  that is not a finite number > 0); under ``jit`` a traced temperature cannot, and a bad one gives
  new ids of ``-1`` (:func:`sample_logits`).

  Example:
    >>> out = generate(params, tiny(), prompt_BxP, jax.random.key(0), max_new_tokens=32, top_k=40)
  """
  if jnp.ndim(prompt_BxP) != 2:
    raise ValueError(f"prompt must be [batch, length] token ids; got shape {jnp.shape(prompt_BxP)} "
                     "(one prompt: [[ids...]])")
  B, P = jnp.shape(prompt_BxP)
  max_new_tokens = checks.integer("generate: max_new_tokens", max_new_tokens, minimum=0)
  if not isinstance(prompt_BxP, jax.core.Tracer):
    ids = np.asarray(prompt_BxP)
    bad = np.flatnonzero((ids < 0) | (ids >= config.vocab_size)) if ids.size else []
    if len(bad):
      b, t = divmod(int(bad[0]), P)
      raise ValueError(f"prompt[{b}, {t}] = {ids[b, t]} is not a token id in [0, "
                       f"{config.vocab_size})")
  if P < 1:
    raise ValueError(f"prompt must hold at least one token; got shape {jnp.shape(prompt_BxP)}")
  if P + max_new_tokens > config.max_len:
    raise ValueError(f"prompt length {P} + max_new_tokens {max_new_tokens} exceeds "
                     f"config.max_len={config.max_len}")
  limit = checks.integer("generate: vocab_limit",
                         config.vocab_size if vocab_limit is None else vocab_limit, minimum=1,
                         maximum=config.vocab_size, hint="the model's vocab_size")
  checks.integer("generate: top_k", top_k, minimum=1, maximum=limit, optional=True,
                 hint="the vocabulary" if vocab_limit is None else "the vocab_limit")
  rows_greedy = tuple(greedy) if isinstance(greedy, (tuple, list)) else (bool(greedy),) * B
  if len(rows_greedy) != B:
    raise ValueError(f"greedy must be one bool or one per prompt row ({B}); got {greedy!r}")
  top_p = check_top_p(top_p)
  if not all(rows_greedy):
    _check_temperature(temperature)
  prompt_BxP = jnp.asarray(prompt_BxP, jnp.int32)
  if max_new_tokens == 0:
    return prompt_BxP

  model = Transformer(config)

  def forward(cache, tokens_BxT):
    logits_BxTxV, state = model.apply({"params": params, "cache": cache}, tokens_BxT,
                                      decode=True, mutable=["cache"])
    return state["cache"], logits_BxTxV[:, -1]

  argmax_rows = [b for b, g in enumerate(rows_greedy) if g]
  drawn_rows = [b for b, g in enumerate(rows_greedy) if not g]

  def sample(logits_BxV, step_key):
    if limit < logits_BxV.shape[-1]:
      logits_BxV = jnp.where(jnp.arange(logits_BxV.shape[-1]) < limit, logits_BxV, -jnp.inf)
    draw = lambda logits, g: sample_logits(logits, step_key, temperature=temperature,
                                           top_k=top_k, greedy=g, top_p=top_p)
    if not drawn_rows or not argmax_rows:
      return draw(logits_BxV, not drawn_rows)
    rows = lambda which: logits_BxV[np.asarray(which)]
    token_B = jnp.zeros((B,), jnp.int32).at[np.asarray(argmax_rows)].set(
        draw(rows(argmax_rows), True))
    return token_B.at[np.asarray(drawn_rows)].set(draw(rows(drawn_rows), False))

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
