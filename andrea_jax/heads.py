r"""Attention heads as subspaces: each head's projections, and the angles between their subspaces.

A head ``h`` of a block reads the residual stream ``x in R^D`` through three ``D x Dh`` matrices:
``q = x W_q^h``, ``k = x W_k^h``, ``v = x W_v^h``. Its score ``q . k = x W_q^h (W_k^h)^T x'`` only
sees the components of ``x`` in the column space of ``W_q^h`` and ``x'`` in that of ``W_k^h``: each
head looks through its own ``Dh``-dimensional subspace of ``R^D`` (ANDREA-120M: 64 of 768).

How far apart two heads' subspaces are is measured by their **principal angles**
``0 <= theta_1 <= ... <= theta_m <= pi/2``: with orthonormal bases ``Q_a``, ``Q_b``, the cosines
``cos theta_i`` are the singular values of ``Q_a^T Q_b``. Their mean square,

.. math::
   \mathrm{overlap}(A, B) = \frac{1}{m} \sum_i \cos^2\theta_i = \frac{\|Q_a^T Q_b\|_F^2}{m},
   \qquad m = \min(\dim A, \dim B),

is 1 for the same subspace, 0 for orthogonal ones, and ``max(dim A, dim B) / D`` on average for
a random ``B`` (``Dh / D`` for two random heads: 0.25 for the tiny model's 32 of 128).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from andrea_jax import checks
from andrea_jax.model import ModelConfig

PyTree = Any


def head_projections(params: PyTree, config: ModelConfig, layer: int) -> dict[str, jax.Array]:
  """The per-head query, key and value matrices of block ``layer``: ``{"q", "k", "v"}``, each
  ``[H, D, Dh]``.

  The model fuses them in one ``c_attn`` kernel ``[D, 3D]`` whose columns are ordered
  ``(q|k|v, head, Dh)`` (:class:`andrea_jax.model.CausalSelfAttention`). The biases and the
  LayerNorm before the block are left out: they shift and rescale ``x``, not the subspaces.

  Example:
    >>> p = head_projections(params, config, 0)
    >>> p["q"].shape   # (num_heads, d_model, head_dim)
    (4, 128, 32)
  """
  layer = checks.integer("head_projections: layer", layer, minimum=0,
                         maximum=config.num_layers - 1,
                         hint=f"a layer of the model's num_layers = {config.num_layers}")
  kernel_Dx3D = params[f"h_{layer}"]["attn"]["c_attn"]["kernel"]
  d, h, dh = config.d_model, config.num_heads, config.head_dim
  w_Dx3xHxDh = jnp.reshape(kernel_Dx3D, (d, 3, h, dh))
  return {name: jnp.transpose(w_Dx3xHxDh[:, i], (1, 0, 2)) for i, name in enumerate("qkv")}


def _basis(a_DxK: jax.Array) -> jax.Array:
  q_DxK, _ = jnp.linalg.qr(a_DxK)
  return q_DxK


def _check_bases(a, b, ndim: int, want: str) -> None:
  """The spanning sets of two subspaces (or two stacks of them): same ``D``, at least one column."""
  sa, sb = jnp.shape(a), jnp.shape(b)
  if len(sa) != ndim or len(sb) != ndim or sa[-2] != sb[-2] or sa[-1] < 1 or sb[-1] < 1:
    raise ValueError(f"a and b must be {want} with the same D and at least one column, got "
                     f"{sa} and {sb}")


@jax.jit
def principal_angles(a_DxK: jax.Array, b_DxM: jax.Array) -> jax.Array:
  """The ``min(K, M)`` principal angles (radians, ascending) between the column spaces of ``a``
  and ``b``.

  With ``Q`` orthonormal bases from QR (full column rank assumed) and ``A`` the larger subspace,
  the cosines are the singular values of ``Q_A^T Q_B`` and the sines those of
  ``Q_B - Q_A Q_A^T Q_B``; small angles are taken from their sine and large ones from their
  cosine, because ``arccos`` loses the small ones to rounding (Knyazev & Argentati, 2002).

  Example (the x-y plane against a plane tilted by 30 degrees about the x axis):
    >>> a = jnp.array([[1., 0], [0, 1], [0, 0]])
    >>> b = jnp.array([[1., 0], [0, jnp.cos(jnp.pi / 6)], [0, jnp.sin(jnp.pi / 6)]])
    >>> jnp.degrees(principal_angles(a, b))   # [0, 30]
  """
  _check_bases(a_DxK, b_DxM, 2, "[D, K] and [D, M]")
  if a_DxK.shape[1] < b_DxM.shape[1]:
    a_DxK, b_DxM = b_DxM, a_DxK
  qa_DxK, qb_DxM = _basis(a_DxK), _basis(b_DxM)
  c_KxM = qa_DxK.T @ qb_DxM
  cos_M = jnp.linalg.svd(c_KxM, compute_uv=False)                      # descending
  sin_M = jnp.linalg.svd(qb_DxM - qa_DxK @ c_KxM, compute_uv=False)[::-1]  # ascending
  small = cos_M**2 >= 0.5
  return jnp.where(small, jnp.arcsin(jnp.clip(sin_M, 0.0, 1.0)),
                   jnp.arccos(jnp.clip(cos_M, 0.0, 1.0)))


@jax.jit
def subspace_overlap(a_DxK: jax.Array, b_DxM: jax.Array) -> jax.Array:
  """Mean ``cos^2`` of the principal angles: ``||Q_a^T Q_b||_F^2 / min(K, M)``, in ``[0, 1]``.

  Example: ``subspace_overlap(a, a) == 1``; orthogonal subspaces give 0.
  """
  _check_bases(a_DxK, b_DxM, 2, "[D, K] and [D, M]")
  c_KxM = _basis(a_DxK).T @ _basis(b_DxM)
  return jnp.sum(c_KxM**2) / min(a_DxK.shape[1], b_DxM.shape[1])


@jax.jit
def overlap_matrix(a_HxDxK: jax.Array, b_HxDxM: jax.Array | None = None) -> jax.Array:
  """``[H, H']`` matrix of :func:`subspace_overlap` between the heads of ``a`` and those of ``b``
  (default ``a``: heads against each other, 1 on the diagonal).

  Example: ``overlap_matrix(p["q"])`` compares the query subspaces of one block's heads;
  ``overlap_matrix(p["q"], p["k"])`` each head's query subspace with every head's key subspace.
  """
  b_HxDxM = a_HxDxK if b_HxDxM is None else b_HxDxM
  _check_bases(a_HxDxK, b_HxDxM, 3, "[H, D, K] and [H', D, M]")   # shapes: static under jit
  qa_HxDxK = jax.vmap(_basis)(a_HxDxK)
  qb_HxDxM = jax.vmap(_basis)(b_HxDxM)
  c_HxHxKxM = jnp.einsum("adk,bdm->abkm", qa_HxDxK, qb_HxDxM)
  return jnp.sum(c_HxHxKxM**2, axis=(2, 3)) / min(a_HxDxK.shape[2], b_HxDxM.shape[2])
