"""A saved run as a loss terrain: a held-out loss function over the run's evaluation windows.

A run's config and the parameters of one step come from
:func:`andrea_jax.checkpoint.load_checkpoint`.
:func:`heldout_loss_fn` closes the model's mean next-token loss over a fixed batch of the run's
evaluation windows, the ``loss_fn(params)`` every :mod:`andrea_jax.terrain` measurement takes, in
chunks of windows whose size :func:`windows_per_chunk` picks from a memory budget.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from andrea_jax import checks
from andrea_jax import data as data_lib
from andrea_jax import evaluate, runconfig
from andrea_jax import step as step_lib
from andrea_jax.model import ModelConfig, Transformer
from andrea_jax.terrain import budget as budget_lib

PyTree = Any


def heldout_batch(config: ml_collections.ConfigDict, run: runconfig.Run, *,
                  sequences_per_source: int | None = None,
                  sources: Sequence[str] | None = None) -> dict[str, np.ndarray]:
  """The run's evaluation windows, all sources concatenated: ``[n * len(sources), T]`` arrays.

  The same fixed windows as the trainer's evaluation (:func:`andrea_jax.data.eval_batches`):
  ``sequences_per_source`` (default ``config.eval.sequences_per_source``) per source of ``sources``
  (default the run's sources in use), with ``source_ids``.
  """
  sources = tuple(run.evaluated if sources is None else sources)
  unknown = [s for s in sources if s not in run.sources]
  if unknown or not sources:
    raise ValueError(f"sources must be a non-empty subset of {list(run.sources)}, got "
                     f"{list(sources)}")
  n = config.eval.sequences_per_source if sequences_per_source is None else sequences_per_source
  data = data_lib.open_training_data(run.data, required=sources, progress=False)
  parts = []
  for name in sources:
    b = data_lib.eval_batches(data, name, seq_len=run.data.seq_len, num_sequences=n)
    parts.append(dict(b, source_ids=np.full((b["inputs"].shape[0],), run.sources.index(name),
                                            np.int32)))
  return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}


def heldout_loss_fn(model_config: ModelConfig, batch: dict[str, np.ndarray], *,
                    window_batch: int | None = None) -> Callable[[PyTree], jax.Array]:
  """``params -> mean next-token loss`` (nats/token, float32) over ``batch``.

  ``L(w) = sum_{b,t} m_bt CE(f_w(x)_bt, y_bt) / sum m_bt`` with ``m`` the mask of real tokens. The
  model runs in float32 with XLA attention: Hessian-vector products differentiate the backward
  pass, which cuDNN's fused attention cannot (it has no forward-mode rule), and curvature needs
  float32.

  Memory: ``window_batch=None`` runs all ``B`` windows through the model at once. An int ``c``
  cuts them into ``ceil(B / c)`` chunks of equal size (at most ``c``; the last one padded with rows
  that do not count, as the trainer's evaluation pads) and sums the chunks' losses in a
  ``lax.scan`` whose body is rematerialised (``jax.checkpoint``): a forward pass, a gradient or a
  Hessian-vector product then holds the activations of one chunk, not of all ``B`` windows. The
  value is the same up to float32 rounding (the order of the sum).

  Example:
    >>> loss_fn = heldout_loss_fn(saved.run.model, batch, window_batch=16)
    >>> loss_fn(saved.params)  # the mean over all of batch's windows, 16 at a time
  """
  window_batch = checks.integer("heldout_loss_fn: window_batch", window_batch, minimum=1,
                                optional=True)
  model = Transformer(dataclasses.replace(model_config, attention_impl="xla", dtype="float32"))
  rows = int(batch["inputs"].shape[0])
  num_tokens = float(np.maximum(np.sum(np.asarray(batch["segment_ids"]) > 0), 1))
  if window_batch is None or window_batch >= rows:
    whole = {k: jnp.asarray(v) for k, v in batch.items()}

    def loss_fn(params: PyTree) -> jax.Array:
      loss_BxT, _ = step_lib.token_losses(model, params, whole)
      return loss_BxT.sum() / num_tokens
    return loss_fn

  num_chunks = -(-rows // window_batch)
  chunk_rows = -(-rows // num_chunks)   # as even as whole rows allow: the padding is < num_chunks
  chunks_C = {k: jnp.stack([jnp.asarray(c[k]) for c in evaluate.eval_chunks(batch, chunk_rows)])
              for k in batch}   # [C, chunk_rows, T]

  @jax.checkpoint   # the backward pass recomputes one chunk's activations instead of storing all
  def chunk_sum(params: PyTree, chunk: dict[str, jax.Array]) -> jax.Array:
    loss_BxT, _ = step_lib.token_losses(model, params, chunk)
    return loss_BxT.sum()

  def loss_fn(params: PyTree) -> jax.Array:
    total, _ = jax.lax.scan(lambda acc, chunk: (acc + chunk_sum(params, chunk), None),
                            jnp.zeros((), jnp.float32), chunks_C)
    return total / num_tokens
  return loss_fn


def windows_per_chunk(model_config: ModelConfig, batch: dict[str, np.ndarray], params: PyTree,
                      memory_budget: int, *, reserve: int = 0) -> int:
  """The most held-out windows one Hessian-vector product may take within ``memory_budget``.

  A Hessian-vector product is the costliest single evaluation of the terrain (about two gradients'
  memory), so a loss whose chunks of windows (:func:`heldout_loss_fn`'s ``window_batch``) fit one
  HVP in ``memory_budget - reserve`` bytes fits every other evaluation too; ``reserve`` is what
  stays allocated beside it (the Lanczos basis). The bytes are XLA's plan for the compiled HVP
  (:func:`andrea_jax.terrain.budget.hvp_bytes`) on 1 and 2 windows, ``fixed + per_window * c``
  in between; the chosen count is then checked on the chunked loss itself and lowered until it
  fits. The count returned is the chunk :func:`heldout_loss_fn` makes of it (as many chunks, of
  equal rows).

  Raises ``ValueError`` when not even one window fits, naming both sizes.

  Example:
    >>> windows_per_chunk(saved.run.model, batch, saved.params, 2 * 2**30)
    128
  """
  rows = int(batch["inputs"].shape[0])
  room = memory_budget - reserve
  first = lambda n: {k: v[:n] for k, v in batch.items()}
  one = budget_lib.hvp_bytes(heldout_loss_fn(model_config, first(1)), params)
  if one > room:
    raise ValueError(
        f"one Hessian-vector product on one held-out window needs {budget_lib.format_bytes(one)}"
        + (f" beside {budget_lib.format_bytes(reserve)} of Lanczos basis" if reserve else "")
        + f", over the memory budget of {budget_lib.format_bytes(memory_budget)}: raise the "
        "budget (--memory_budget_gib)" + (" or lower hessian_iters" if reserve else ""))
  if rows == 1:
    return 1
  two = budget_lib.hvp_bytes(heldout_loss_fn(model_config, first(2)), params)
  per_window = max(two - one, 1)
  count = int(min(rows, max(1, (room - max(one - per_window, 0)) // per_window)))
  # The scan over chunks is a different program from one batch of windows: check it, and back off
  # in proportion to the excess (its memory grows about linearly with the chunk).
  while count > 1:
    need = budget_lib.hvp_bytes(heldout_loss_fn(model_config, batch, window_batch=count), params)
    if need <= room:
      break
    count = max(1, min(count - 1, count * room // need))
  return -(-rows // -(-rows // count))   # the chunk heldout_loss_fn makes of it: as many, evened
