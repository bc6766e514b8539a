"""Scaled dot-product attention and the masks that shape it (causal, padding, document).

Attention as projection: per head, ``softmax(q k^T / sqrt(d_k)) v``. The score ``q . k_j`` is the
projection of key ``k_j`` on the query direction; the softmax turns the projections into weights
that sum to 1 and the output mixes the values with them. Dividing by ``sqrt(d_k)`` keeps the scores
at unit variance, so the softmax does not saturate as ``d_k`` grows.

Masks are boolean, ``True`` = "may attend", rank 4 and broadcastable to ``[B, H, T, S]``
(batch, heads, query positions, key positions). They are pure functions of shapes or token ids.

Two implementations sit behind :func:`dot_product_attention`:

* ``"xla"``: the formula written out in ``jnp`` (scores and softmax in float32 whatever the input
  dtype), runs everywhere.
* ``"cudnn"``: ``jax.nn.dot_product_attention(..., implementation="cudnn")``, the fused (flash)
  kernel on NVIDIA GPUs, for bf16/fp16 inputs with a head dimension that is a multiple of 8 and at
  most 128.

How masks reach cuDNN (jax 0.10.2): a causal-only mask is passed as ``is_causal=True`` so the
kernel skips the upper triangle instead of reading a dense mask. The public
``jax.nn.dot_product_attention`` has no segment-id argument (the packed "q_offsets/kv_offsets"
layout exists only in the private ``jax._src.cudnn`` entry point, and needs a static maximum number
of documents per row and a Hopper GPU), so a document or padding mask goes to cuDNN as a dense
boolean mask, which jax turns into an additive bf16 bias ``[B, 1, T, T]`` (whose unused gradient
the kernel also computes), together with ``is_causal=True``.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

IMPLEMENTATIONS = (None, "xla", "cudnn")

# Finite stand-in for -inf: exp() of it is exactly 0 in float32, and a fully masked row stays finite
# (all scores equal) instead of turning into 0/0.
_MASKED_SCORE = -1e30


def causal_mask(T: int) -> jax.Array:
  """Causal mask ``[1, 1, T, T]``: query ``t`` may attend to keys ``0..t``.

  ``mask[0, 0, t, s] = s <= t``.

  Example:
    >>> causal_mask(3)[0, 0].astype(int)
    [[1, 0, 0], [1, 1, 0], [1, 1, 1]]
  """
  return jnp.tril(jnp.ones((T, T), dtype=bool))[None, None]


def padding_mask(valid_BxT: jax.Array) -> jax.Array:
  """Key padding mask ``[B, 1, 1, T]`` from a ``[B, T]`` array of valid (truthy) key positions.

  ``mask[b, 0, 0, s] = valid[b, s]``: every query may attend to the valid keys only.

  Example:
    >>> padding_mask(jnp.array([[1, 1, 0]]))[0, 0, 0]
    [True, True, False]
  """
  return jnp.asarray(valid_BxT).astype(bool)[:, None, None, :]


def document_mask(segment_ids_BxT: jax.Array) -> jax.Array:
  """Causal block-diagonal mask ``[B, 1, T, T]`` for packed sequences.

  ``mask[b, 0, t, s] = (seg[b, t] == seg[b, s]) and seg[b, t] > 0 and s <= t``: a token attends to
  earlier tokens of its own document only. Segment id 0 marks padding, which attends to nothing and
  is attended by nothing.

  Example:
    >>> document_mask(jnp.array([[1, 1, 2, 0]]))[0, 0].astype(int)
    [[1, 0, 0, 0], [1, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 0]]
  """
  seg_BxT = jnp.asarray(segment_ids_BxT)
  same_BxTxT = seg_BxT[:, :, None] == seg_BxT[:, None, :]
  real_BxTxT = (seg_BxT > 0)[:, :, None] & (seg_BxT > 0)[:, None, :]
  T = seg_BxT.shape[1]
  return (same_BxTxT & real_BxTxT)[:, None] & causal_mask(T)


def combine_masks(*masks: jax.Array | None) -> jax.Array | None:
  """Logical AND of masks with broadcasting; ``None`` entries are ignored; all ``None`` -> ``None``.

  Example:
    >>> combine_masks(causal_mask(4), None, padding_mask(valid_BxT)).shape
    (B, 1, 4, 4)
  """
  present = [m for m in masks if m is not None]
  if not present:
    return None
  return functools.reduce(jnp.logical_and, [jnp.asarray(m).astype(bool) for m in present])


def _check_inputs(q, k, v, mask, is_causal):
  if q.ndim != 4 or k.ndim != 4 or v.ndim != 4:
    raise ValueError(
        f"q, k, v must be [B, T, H, Dh]; got shapes {q.shape}, {k.shape}, {v.shape}")
  if k.shape != v.shape or q.shape[0] != k.shape[0] or q.shape[2:] != k.shape[2:]:
    raise ValueError(f"incompatible q, k, v shapes {q.shape}, {k.shape}, {v.shape}")
  if mask is not None and jnp.ndim(mask) != 4:
    raise ValueError(f"mask must have rank 4 (broadcastable to [B, H, T, S]); got shape "
                     f"{jnp.shape(mask)}")
  if is_causal and q.shape[1] != k.shape[1]:
    raise ValueError(f"is_causal needs as many queries as keys; got T={q.shape[1]}, "
                     f"S={k.shape[1]}")


def _weights_f32(q_BxTxHxD, k_BxSxHxD, mask):
  """Softmax weights ``[B, H, T, S]`` (float32, or float64 for float64 inputs); rows with no allowed
  key are all zeros."""
  # Scores and softmax in float32 even for bf16 inputs (as the fused kernels do); float64 stays.
  acc_dtype = jnp.promote_types(q_BxTxHxD.dtype, jnp.float32)
  scale = 1.0 / jnp.sqrt(jnp.asarray(q_BxTxHxD.shape[-1], acc_dtype))
  scores_BxHxTxS = jnp.einsum(
      "bthd,bshd->bhts", q_BxTxHxD, k_BxSxHxD, preferred_element_type=acc_dtype) * scale
  if mask is None:
    return jax.nn.softmax(scores_BxHxTxS, axis=-1)
  scores_BxHxTxS = jnp.where(mask, scores_BxHxTxS, _MASKED_SCORE)
  probs_BxHxTxS = jax.nn.softmax(scores_BxHxTxS, axis=-1)
  return jnp.where(jnp.any(mask, axis=-1, keepdims=True), probs_BxHxTxS, 0.0)


def attention_weights(q: jax.Array, k: jax.Array, mask: jax.Array | None = None) -> jax.Array:
  """Attention probabilities ``softmax(q k^T / sqrt(Dh))`` as float32 ``[B, H, T, S]`` (float64 for
  float64 inputs).

  For inspection (notebooks, the model's ``intermediates``). Masked entries are exactly 0; a query
  with no allowed key gets a row of zeros.

  Args:
    q: queries ``[B, T, H, Dh]``.
    k: keys ``[B, S, H, Dh]``.
    mask: optional boolean mask broadcastable to ``[B, H, T, S]``, True = may attend.

  Example (the source document's numbers, one head, one query, three keys):
    >>> q = jnp.array([1., 0, 1, 0]).reshape(1, 1, 1, 4)
    >>> k = jnp.array([[1., 0, 0, 0], [0, 0, 1, 0], [0, 1, 0, 1]]).reshape(1, 3, 1, 4)
    >>> attention_weights(q, k)[0, 0, 0]   # scores (0.5, 0.5, 0)
    [0.383652, 0.383652, 0.232697]
  """
  _check_inputs(q, k, k, mask, False)
  return _weights_f32(q, k, mask)


def _xla_attention(q, k, v, mask, is_causal):
  if is_causal:
    mask = combine_masks(mask, causal_mask(q.shape[1]))
  probs_BxHxTxS = _weights_f32(q, k, mask)
  out_BxTxHxD = jnp.einsum("bhts,bshd->bthd", probs_BxHxTxS.astype(v.dtype), v,
                           preferred_element_type=probs_BxHxTxS.dtype)
  return out_BxTxHxD.astype(q.dtype)


def _on_cuda_gpu() -> bool:
  if jax.default_backend() != "gpu":
    return False
  device = jax.devices()[0]
  # Flash attention needs Ampere (8.0) or newer; ROCm devices have no compute_capability.
  capability = getattr(device, "compute_capability", None)
  return capability is not None and float(capability) >= 8.0


def cudnn_supported(q: jax.Array, k: jax.Array, v: jax.Array,
                    mask: jax.Array | None = None) -> bool:
  """Whether the cuDNN fused kernel accepts these inputs here (what ``implementation=None`` checks).

  True on an NVIDIA GPU (compute capability >= 8.0) when q, k, v share a bf16/fp16 dtype and the
  head dimension is a multiple of 8 and at most 128; with a mask, which cuDNN receives as an
  additive bias, the training kernel also needs even sequence lengths.
  """
  if not _on_cuda_gpu():
    return False
  if q.dtype not in (jnp.bfloat16, jnp.float16) or not q.dtype == k.dtype == v.dtype:
    return False
  head_dim = q.shape[-1]
  if head_dim % 8 != 0 or head_dim > 128:
    return False
  if mask is not None and (q.shape[1] % 2 != 0 or k.shape[1] % 2 != 0):
    return False
  return True


def _cudnn_attention(q, k, v, mask, is_causal):
  if mask is not None:
    # cuDNN's bias must span the full [T, S] plane; batch and head may stay broadcast (size 1).
    mask = jnp.broadcast_to(mask, mask.shape[:2] + (q.shape[1], k.shape[1]))
  out_BxTxHxD = jax.nn.dot_product_attention(
      q, k, v, mask=mask, is_causal=is_causal, implementation="cudnn")
  if mask is None:
    return out_BxTxHxD
  # cuDNN gives a fully masked row the mean of the values (all biases equal); we promise zeros.
  allowed = combine_masks(mask, causal_mask(q.shape[1]) if is_causal else None)
  row_ok_BxTxHx1 = jnp.any(allowed, axis=-1).transpose(0, 2, 1)[..., None]
  return jnp.where(row_ok_BxTxHx1, out_BxTxHxD, jnp.zeros((), out_BxTxHxD.dtype))


def dot_product_attention(q: jax.Array, k: jax.Array, v: jax.Array,
                          mask: jax.Array | None = None, *, is_causal: bool = False,
                          implementation: str | None = None) -> jax.Array:
  """Multi-head scaled dot-product attention, ``softmax(q k^T / sqrt(Dh)) v`` per head.

  Scores and softmax run in float32 whatever the input dtype (float64 inputs stay float64); the
  output has the dtype of ``q``. A query
  whose row of the mask allows no key returns zeros (never NaN).

  Args:
    q: queries ``[B, T, H, Dh]``.
    k: keys ``[B, S, H, Dh]`` (``S = T`` for self-attention; larger when reading a KV cache).
    v: values ``[B, S, H, Dh]``.
    mask: optional boolean mask, rank 4, broadcastable to ``[B, H, T, S]``; True = may attend.
    is_causal: also apply :func:`causal_mask` (needs ``S == T``). Prefer it to a dense causal mask:
      the cuDNN kernel then skips the masked half instead of reading a mask.
    implementation: ``None`` (auto: cuDNN when :func:`cudnn_supported`, else XLA), ``"xla"`` or
      ``"cudnn"`` (raises where cuDNN cannot run these inputs).

  Returns:
    ``[B, T, H, Dh]``.

  Example:
    >>> out = dot_product_attention(q, k, v, is_causal=True)                  # decoder
    >>> out = dot_product_attention(q, k, v, document_mask(segment_ids))      # packed documents
  """
  if implementation not in IMPLEMENTATIONS:
    raise ValueError(f"implementation must be one of {IMPLEMENTATIONS}; got {implementation!r}")
  _check_inputs(q, k, v, mask, is_causal)
  if mask is not None:
    mask = jnp.asarray(mask).astype(bool)
  if implementation == "cudnn":
    return _cudnn_attention(q, k, v, mask, is_causal)
  if implementation is None and cudnn_supported(q, k, v, mask):
    return _cudnn_attention(q, k, v, mask, is_causal)
  return _xla_attention(q, k, v, mask, is_causal)
