"""Scoring token sequences in batches of a few fixed shapes: what a benchmark asks of a model.

Two questions, each answered for many requests at once (the lm-evaluation-harness backend,
:mod:`andrea_jax.harness`, asks them):

* :meth:`Scorer.loglikelihoods` -- for ``(context, continuation)`` ids, ``log p(continuation |
  context)`` and whether the continuation is the greedy one. As lm-evaluation-harness's ``hf``
  backend cuts them: the window ``w = (context + continuation)[-(max_len + 1):]`` goes in as
  ``w[:-1]`` and the last ``len(continuation)`` positions are scored against ``w[1:]``::

      ids      c0 c1 c2 | k0 k1 k2        (context | continuation)
      inputs   c0 c1 c2   k0 k1
      targets  c1 c2 k0   k1 k2           scored: the last 3, sum of log_softmax(logits)[target]

* :meth:`Scorer.greedy` -- greedy continuations of contexts, up to ``max_new`` ids, each stopped
  at the end-of-document id or where ``stop(new ids)`` says.

Shapes: each request is right-padded to the smallest length of :func:`bucket_lengths` that holds
it; the requests of one length, longest first, are cut into batches of ``batch_size`` rows (the
last filled with empty rows). So jit compiles one program per bucket length used (a handful:
powers of two up to ``max_len``), whatever the requests, and a request is computed in the same
shape whatever the others are. Padding is inert: it sits after every real token, and attention is
causal. Logits and log-softmax are float32.

Example:
  >>> scorer = Scorer(params, config, batch_size=16)
  >>> scorer.loglikelihoods([([256, 84, 104], [101, 32])])   # [(-5.1, False)]
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from andrea_jax import checks
from andrea_jax.model import ModelConfig, PyTree, Transformer

MIN_BUCKET = 16


def bucket_lengths(max_len: int) -> list[int]:
  """The padded lengths a batch may take: powers of two from 16 below ``max_len``, then it.

  Example:
    >>> bucket_lengths(100)
    [16, 32, 64, 100]
  """
  out, n = [], MIN_BUCKET
  while n < max_len:
    out.append(n)
    n *= 2
  return out + [max_len]


def bucket(n: int, max_len: int) -> int:
  """The smallest of :func:`bucket_lengths` that holds ``n`` tokens."""
  return next(b for b in bucket_lengths(max_len) if b >= n)


class Scorer:
  """Log-likelihoods and greedy continuations of one model (see the module docstring).

  Args:
    params: the parameter tree.
    config: its :class:`ModelConfig` (computed in its ``dtype``; pass float32 to score as the
      reference backends do).
    batch_size: rows per program call.
  """

  def __init__(self, params: PyTree, config: ModelConfig, batch_size: int = 16):
    self.params, self.config = params, config
    self.batch_size = checks.integer("Scorer: batch_size", batch_size, minimum=1)
    model = Transformer(config)

    def scored(params, inputs_BxT, targets_BxT):
      logits_BxTxV = model.apply({"params": params}, inputs_BxT).astype(jnp.float32)
      logp_BxTxV = jax.nn.log_softmax(logits_BxTxV, axis=-1)
      logp_BxT = jnp.take_along_axis(logp_BxTxV, targets_BxT[..., None], axis=-1)[..., 0]
      return logp_BxT, jnp.argmax(logits_BxTxV, axis=-1) == targets_BxT

    def next_ids(params, tokens_BxT, lengths_B):
      logits_BxTxV = model.apply({"params": params}, tokens_BxT)
      last_BxV = jnp.take_along_axis(logits_BxTxV, (lengths_B - 1)[:, None, None], axis=1)[:, 0]
      return jnp.argmax(last_BxV, axis=-1).astype(jnp.int32)

    self._scored = jax.jit(scored)
    self._next_ids = jax.jit(next_ids)

  def _batches(self, lengths: Sequence[int]) -> list[tuple[int, list[int]]]:
    """``(padded length, indices)`` of each batch: the requests of each bucket length, longest
    first, cut into batches of ``batch_size``."""
    max_len = self.config.max_len
    padded = [bucket(n, max_len) for n in lengths]
    order = sorted(range(len(lengths)), key=lambda i: (-padded[i], -lengths[i], i))
    out = []
    for T in sorted(set(padded), reverse=True):
      same = [i for i in order if padded[i] == T]
      out += [(T, same[k:k + self.batch_size]) for k in range(0, len(same), self.batch_size)]
    return out

  def loglikelihoods(self, requests: Sequence[tuple[Sequence[int], Sequence[int]]]
                     ) -> list[tuple[float, bool]]:
    """``(sum of the continuation's log-probabilities, whether each of its ids is the argmax)``
    of each ``(context, continuation)``, in the order given. The context holds at least one id,
    the continuation between 1 and ``max_len``."""
    max_len = self.config.max_len
    windows = []
    for i, (context, continuation) in enumerate(requests):
      if not context or not continuation or len(continuation) > max_len:
        raise ValueError(f"request {i}: the context needs >= 1 id and the continuation 1 to "
                         f"{max_len}; got {len(context)} and {len(continuation)}")
      whole = (list(context) + list(continuation))[-(max_len + 1):]
      windows.append((whole, len(continuation)))
    out: list[tuple[float, bool] | None] = [None] * len(windows)
    for T, rows in self._batches([len(w) - 1 for w, _ in windows]):
      inputs_BxT = np.zeros((self.batch_size, T), np.int32)
      targets_BxT = np.zeros((self.batch_size, T), np.int32)
      for r, i in enumerate(rows):
        whole = windows[i][0]
        inputs_BxT[r, :len(whole) - 1] = whole[:-1]
        targets_BxT[r, :len(whole) - 1] = whole[1:]
      logp_BxT, greedy_BxT = jax.device_get(self._scored(self.params, inputs_BxT, targets_BxT))
      for r, i in enumerate(rows):
        whole, n = windows[i]
        cut = slice(len(whole) - 1 - n, len(whole) - 1)
        out[i] = (float(np.sum(logp_BxT[r, cut], dtype=np.float64)), bool(greedy_BxT[r, cut].all()))
    return out

  def greedy(self, contexts: Sequence[Sequence[int]], max_new: int, eod_id: int,
             stop: Callable[[list[int]], bool] | None = None) -> list[list[int]]:
    """The greedy continuation of each context (at most ``max_new`` ids, each context plus
    ``max_new`` within ``max_len``), cut after ``eod_id`` (excluded) or once ``stop(new ids)``
    is true; in the order given.

    Each step is one forward pass over the batch's padded rows (no KV cache: the rows have
    different lengths), the next id read at each row's last position.
    """
    max_len = self.config.max_len
    for i, c in enumerate(contexts):
      if not c or len(c) + max_new > max_len:
        raise ValueError(f"context {i}: {len(c)} ids + {max_new} new exceed max_len {max_len} "
                         "(or it is empty)")
    out: list[list[int]] = [[] for _ in contexts]
    for T, rows in self._batches([len(c) + max_new for c in contexts]):
      tokens_BxT = np.zeros((self.batch_size, T), np.int32)
      lengths_B = np.ones((self.batch_size,), np.int32)
      for r, i in enumerate(rows):
        tokens_BxT[r, :len(contexts[i])] = contexts[i]
        lengths_B[r] = len(contexts[i])
      done = [False] * len(rows)
      for _ in range(max_new):
        ids_B = np.asarray(self._next_ids(self.params, tokens_BxT, lengths_B))
        for r, i in enumerate(rows):
          if done[r]:
            continue
          if ids_B[r] == eod_id:
            done[r] = True
            continue
          out[i].append(int(ids_B[r]))
          tokens_BxT[r, lengths_B[r]] = ids_B[r]
          lengths_B[r] += 1
          done[r] = stop is not None and stop(out[i])
        if all(done):
          break
    return out
