r"""The tied output projection and the cross-entropy fused into one op with its own gradient.

For final hidden states ``x_n`` (rows ``n`` of ``x [N, D]``), the embedding ``E [Vp, D]`` (its
``Vp = padded_vocab_size`` rows, of which the first ``V = vocab_size`` are real tokens), targets
``y_n`` and per-token weights ``w_n``:

.. math::
   z_{n,v} = e_v \cdot x_n, \qquad
   \mathrm{lse}_n = \log \sum_{v < V} e^{z_{n,v}}, \qquad
   \ell_n = w_n\,(\mathrm{lse}_n - z_{n,y_n})

and for a cotangent ``c_n`` of ``ℓ_n`` (``1 / tokens`` in the train step, so the gradient comes
out already divided by the token count):

.. math::
   \frac{\partial}{\partial z_{n,v}} = c_n w_n \big(p_{n,v} - [v = y_n]\big)\,[v < V],\quad
   p_{n,v} = e^{z_{n,v} - \mathrm{lse}_n}; \qquad
   dX = dZ\,E, \quad dE = dZ^\top X, \quad dw_n = c_n (\mathrm{lse}_n - z_{n,y_n}).

Dtypes (``dtype`` is the model's compute dtype: bf16 on accelerators, float32 on the CPU demo):

* the three matmuls, ``Z = X E^T``, ``dX = dZ E`` and ``dE = dZ^T X``, take ``dtype`` operands and
  accumulate in float32 (``preferred_element_type``): bf16 tensor-core matmuls, where the unfused
  path ran both backward products on float32 operands (TF32 on a GPU, at half the bf16 rate);
* ``Z`` is stored in ``logits_dtype`` (``dtype`` by default, so bf16 as PyTorch's autocast keeps
  its logits; ``float32`` on request), and read back in float32 for the max, the log-sum-exp, the
  label's logit and the softmax;
* ``dZ`` is formed in float32 and rounded to ``dtype`` for the two backward matmuls; ``dX`` is
  returned in ``x``'s dtype, ``dE`` in float32 (the parameter's dtype: the embedding's gradient is
  never rounded to bf16).

The padded columns ``v >= V`` are masked inside the reductions (an iota compare), so they never
reach the softmax and their embedding rows get an exact zero gradient; the label's logit is a
one-hot compare fused into a sum. Nothing is sliced to ``V``, padded back or scattered (the unfused
path's ``take_along_axis`` transposes to a scatter over ``[N, V]``).

What is materialised, at ANDREA-120M's B=64, T=1024 (``N = 65,536``, ``Vp = 50,304``, ``D = 768``):
``Z`` is 13.2 GB in float32 and 6.6 GB in bf16. The unfused path wrote the float32 logits, a sliced
copy, the log-softmax and their float32 cotangents, about seven passes over 13.2 GB. Here the
forward writes ``Z`` once (6.6 GB in bf16, kept for the backward) and reads it for the reductions;
the backward reads it once more to form ``dZ`` (6.6 GB in bf16, which may take ``Z``'s buffer),
which the two matmuls read. Keeping ``Z`` costs a write and a read (~3 ms at ~4 TB/s) where
recomputing it in the backward would cost a fourth matmul of ``2 N D Vp`` = 5.1 TFLOP (~8 ms on an
H100).

Row blocks (``block_rows``): the rows can be processed ``block_rows`` at a time (a ``lax.scan``),
which bounds the transients (the float32 product before its rounding, ``dZ``) to
``block_rows x Vp`` instead of ``N x Vp`` (at 8,192 rows: 1.6 GB in float32, 0.8 GB in bf16,
against 13.2 and 6.6 GB). ``Z`` itself is still kept whole for the backward (recomputing it is the
slower trade above). The price: each block reads and writes the float32 ``dE`` accumulator
(``Vp x D x 4`` = 155 MB, twice per block: 2.5 GB over 8 blocks, ~0.6 ms) and the blocks run one
after another. One block (``block_rows = 0``, the default) is the faster choice wherever the
transients fit, as they do with room to spare for one GPU's 64 rows of 1024 on an 80 GB H100;
blocks are for memory pressure (larger batches per device, smaller devices).

:func:`cross_entropy` is plain JAX with a ``jax.custom_vjp``: it lowers for any platform (CPU,
CUDA, TPU), jits, vmaps and nests in ``jax.grad`` (reverse mode only: a ``custom_vjp`` has no
``jvp``, so forward-over-reverse Hessian products take the model's logits instead). The train step
uses it (:func:`andrea_jax.step.token_losses` with an ``xent`` config); evaluation and sampling keep
the model's logits (``Transformer.apply``).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp

from andrea_jax import checks

LOGITS_DTYPES = (None, "float32", "bfloat16")


@dataclasses.dataclass(frozen=True)
class XentConfig:
  """How the train step runs the fused output projection and loss; validated on construction.

  Attributes:
    logits_dtype: the stored logits' dtype: ``None`` (the model's compute dtype: bf16 on
      accelerators), ``"float32"`` or ``"bfloat16"``.
    block_rows: tokens (rows of ``B x T``) per block; 0 processes them all at once (see the module
      doc for the trade).
  """
  logits_dtype: str | None = None
  block_rows: int = 0

  def __post_init__(self):
    if self.logits_dtype not in LOGITS_DTYPES:
      raise ValueError(f"XentConfig.logits_dtype must be one of {LOGITS_DTYPES}; got "
                       f"{self.logits_dtype!r}")
    object.__setattr__(self, "block_rows",
                       checks.integer("XentConfig.block_rows", self.block_rows, minimum=0))


def _acc(dtype):
  """The accumulation dtype: float32 for bf16 and float32 operands (float64 stays float64)."""
  return jnp.promote_types(dtype, jnp.float32)


def _dot_acc(a, b, contract):
  """``a . b`` contracted over ``contract`` (lhs axis, rhs axis), accumulated in :func:`_acc`."""
  return jax.lax.dot_general(a, b, (((contract[0],), (contract[1],)), ((), ())),
                             preferred_element_type=_acc(a.dtype))


def _col_iota(shape):
  return jax.lax.broadcasted_iota(jnp.int32, shape, 1)


def _block_forward(x_RxD, e_VpxD, labels_R, vocab_size, logits_dtype):
  """Logits ``[R, Vp]`` (stored dtype), their log-sum-exp over the real columns and the label's
  logit ``[R]`` (accumulation dtype)."""
  logits_RxVp = _dot_acc(x_RxD, e_VpxD, (1, 1)).astype(logits_dtype)
  z_RxVp = logits_RxVp.astype(_acc(x_RxD.dtype))
  col_RxVp = _col_iota(z_RxVp.shape)
  real_RxVp = col_RxVp < vocab_size
  max_R = jnp.max(jnp.where(real_RxVp, z_RxVp, -jnp.inf), axis=-1)
  sum_R = jnp.sum(jnp.where(real_RxVp, jnp.exp(z_RxVp - max_R[:, None]), 0.0), axis=-1)
  label_R = jnp.sum(jnp.where(col_RxVp == labels_R[:, None], z_RxVp, 0.0), axis=-1)
  return logits_RxVp, max_R + jnp.log(sum_R), label_R


def _block_backward(logits_RxVp, lse_R, labels_R, g_R, x_RxD, e_VpxD, vocab_size):
  """``(dX [R, D], dE [Vp, D])`` of one block (accumulation dtype) for row cotangents ``g_R``."""
  z_RxVp = logits_RxVp.astype(_acc(x_RxD.dtype))
  col_RxVp = _col_iota(z_RxVp.shape)
  p_RxVp = jnp.where(col_RxVp < vocab_size, jnp.exp(z_RxVp - lse_R[:, None]), 0.0)
  onehot_RxVp = (col_RxVp == labels_R[:, None]).astype(z_RxVp.dtype)
  dz_RxVp = ((p_RxVp - onehot_RxVp) * g_R[:, None]).astype(x_RxD.dtype)
  return _dot_acc(dz_RxVp, e_VpxD, (1, 0)), _dot_acc(dz_RxVp, x_RxD, (0, 0))


def _blocks(a, n):
  return a.reshape(n, a.shape[0] // n, *a.shape[1:])


def _forward(x_NxD, e_VpxD, labels_N, vocab_size, logits_dtype, block_rows):
  N = x_NxD.shape[0]
  if not block_rows or block_rows >= N:
    return _block_forward(x_NxD, e_VpxD, labels_N, vocab_size, logits_dtype)
  n = N // block_rows
  out = jax.lax.map(lambda xs: _block_forward(xs[0], e_VpxD, xs[1], vocab_size, logits_dtype),
                    (_blocks(x_NxD, n), _blocks(labels_N, n)))
  return tuple(o.reshape(N, *o.shape[2:]) for o in out)


def _backward(logits_NxVp, lse_N, labels_N, g_N, x_NxD, e_VpxD, vocab_size, block_rows):
  N = x_NxD.shape[0]
  if not block_rows or block_rows >= N:
    return _block_backward(logits_NxVp, lse_N, labels_N, g_N, x_NxD, e_VpxD, vocab_size)
  n = N // block_rows

  def body(de_VpxD, xs):
    logits, lse, labels, g, x = xs
    dx_RxD, de = _block_backward(logits, lse, labels, g, x, e_VpxD, vocab_size)
    return de_VpxD + de, dx_RxD

  de_VpxD, dx_nxRxD = jax.lax.scan(
      body, jnp.zeros(e_VpxD.shape, _acc(x_NxD.dtype)),
      tuple(_blocks(a, n) for a in (logits_NxVp, lse_N, labels_N, g_N, x_NxD)))
  return dx_nxRxD.reshape(N, -1), de_VpxD


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5, 6, 7))
def _xent(x_NxD, embedding_VpxD, labels_N, weights_N, vocab_size, dtype, logits_dtype,
          block_rows):
  return _xent_fwd(x_NxD, embedding_VpxD, labels_N, weights_N, vocab_size, dtype, logits_dtype,
                   block_rows)[0]


def _xent_fwd(x_NxD, embedding_VpxD, labels_N, weights_N, vocab_size, dtype, logits_dtype,
              block_rows):
  # x arrives in the compute dtype (cast by the caller, whose astype carries dX back to x's own
  # dtype); the embedding is cast here, so that dE comes back in the parameter's float32.
  e_VpxD = embedding_VpxD.astype(dtype)
  logits_NxVp, lse_N, label_N = _forward(x_NxD, e_VpxD, labels_N, vocab_size, logits_dtype,
                                         block_rows)
  ce_N = lse_N - label_N
  residuals = (x_NxD, embedding_VpxD, e_VpxD, labels_N, weights_N, logits_NxVp, lse_N, ce_N)
  return weights_N * ce_N, residuals


def _xent_bwd(vocab_size, dtype, logits_dtype, block_rows, residuals, ct_N):
  del dtype, logits_dtype
  x_NxD, embedding_VpxD, e_VpxD, labels_N, weights_N, logits_NxVp, lse_N, ce_N = residuals
  dx_NxD, de_VpxD = _backward(logits_NxVp, lse_N, labels_N, ct_N * weights_N, x_NxD, e_VpxD,
                              vocab_size, block_rows)
  return (dx_NxD.astype(x_NxD.dtype), de_VpxD.astype(embedding_VpxD.dtype), None,
          ct_N * ce_N)


_xent.defvjp(_xent_fwd, _xent_bwd)


def cross_entropy(x_BxTxD: jax.Array, embedding_VpxD: jax.Array, targets_BxT: jax.Array,
                  weights_BxT: jax.Array, *, vocab_size: int, dtype=jnp.float32,
                  logits_dtype=None, block_rows: int = 0) -> jax.Array:
  r"""Weighted per-token cross-entropy of the tied output projection, ``w (lse(x E^T) - z_y)``.

  ``loss[b, t] = weights[b, t] * (log sum_{v < V} exp(z[b, t, v]) - z[b, t, targets[b, t]])`` with
  ``z = x E^T`` over the ``Vp`` rows of the embedding, the columns ``v >= vocab_size`` left out of
  the sum (see the module doc for the gradient, the dtypes and the bytes).

  Args:
    x_BxTxD: final hidden states ``[..., D]`` (any leading shape; ``[B, T, D]`` in the model).
    embedding_VpxD: the tied embedding ``[Vp, D]`` (float32 parameters: cast to ``dtype`` here, so
      their gradient comes back in float32).
    targets_BxT: int target ids, ``x``'s leading shape, each in ``[0, vocab_size)``.
    weights_BxT: float per-token weights, ``x``'s leading shape: 0 for tokens that do not count
      (padding, or a prompt under a "loss on" mask), 1 for those that do; any float is allowed
      and scales that token's loss and gradient.
    vocab_size: ``V``, the real columns (``V <= Vp``).
    dtype: the matmuls' operand dtype (the model's compute dtype).
    logits_dtype: the stored logits' dtype; ``None`` takes ``dtype``.
    block_rows: rows per block (0: all at once); must divide the number of rows.

  Returns:
    ``loss [B, T]`` float32 (float64 for a float64 ``dtype``): the weighted per-token losses (their
    sum over the counted tokens divided by the token count is the mean loss).

  Example:
    >>> x = jnp.ones((1, 1, 2)); E = jnp.array([[1., 0.], [0., 1.], [5., 5.]])   # Vp = 3, V = 2
    >>> cross_entropy(x, E, jnp.array([[0]]), jnp.ones((1, 1)), vocab_size=2)   # ln 2 = 0.693
  """
  lead = jnp.shape(targets_BxT)
  D = x_BxTxD.shape[-1]
  if x_BxTxD.shape[:-1] != lead or jnp.shape(weights_BxT) != lead:
    raise ValueError(f"x {x_BxTxD.shape} must be targets' shape {lead} plus the model dimension, "
                     f"and weights {jnp.shape(weights_BxT)} targets' shape")
  if embedding_VpxD.ndim != 2 or embedding_VpxD.shape[1] != D:
    raise ValueError(f"embedding must be [Vp, {D}]; got shape {embedding_VpxD.shape}")
  if not 0 < vocab_size <= embedding_VpxD.shape[0]:
    raise ValueError(f"vocab_size = {vocab_size} must be in [1, {embedding_VpxD.shape[0]}] (the "
                     "embedding's rows)")
  N = x_BxTxD.size // D
  if block_rows and block_rows < N and N % block_rows:
    raise ValueError(f"block_rows = {block_rows} does not divide the {N} tokens of the batch")
  dtype = jnp.dtype(dtype)
  logits_dtype = dtype if logits_dtype is None else jnp.dtype(logits_dtype)
  loss_N = _xent(x_BxTxD.reshape(N, D).astype(dtype), embedding_VpxD,
                 jnp.reshape(targets_BxT, (N,)),
                 jnp.reshape(weights_BxT, (N,)).astype(_acc(dtype)), int(vocab_size), dtype,
                 logits_dtype, int(block_rows))
  return loss_N.reshape(lead)
