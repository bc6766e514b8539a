"""Attention and masks against hand-worked numbers and an independent float64 NumPy version."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from andrea_jax import attention as att


def _np_attention(q, k, v, mask):
  """Reference: per batch, head and query, a float64 loop over the allowed keys."""
  B, T, H, D = q.shape
  S = k.shape[1]
  mask = np.broadcast_to(mask, (B, H, T, S))
  out = np.zeros((B, T, H, D))
  weights = np.zeros((B, H, T, S))
  for b in range(B):
    for h in range(H):
      for t in range(T):
        allowed = np.flatnonzero(mask[b, h, t])
        if allowed.size == 0:
          continue
        scores = np.array([q[b, t, h] @ k[b, s, h] / math.sqrt(D) for s in allowed])
        e = np.exp(scores - scores.max())
        weights[b, h, t, allowed] = e / e.sum()
        out[b, t, h] = weights[b, h, t] @ v[b, :, h]
  return out, weights


def test_worked_example_from_source_document():
  q = jnp.array([1.0, 0, 1, 0]).reshape(1, 1, 1, 4)
  k = jnp.array([[1.0, 0, 0, 0], [0, 0, 1, 0], [0, 1, 0, 1]]).reshape(1, 3, 1, 4)
  # Scores q.k / sqrt(4) = (0.5, 0.5, 0): weights e^0.5 / (2 e^0.5 + 1) twice, 1 / (2 e^0.5 + 1).
  z = 2 * math.exp(0.5) + 1
  expected = np.array([math.exp(0.5) / z, math.exp(0.5) / z, 1 / z])
  np.testing.assert_allclose(expected, [0.383652, 0.383652, 0.232697], atol=1e-6)

  w = att.attention_weights(q, k)
  assert w.shape == (1, 1, 1, 3) and w.dtype == jnp.float32
  np.testing.assert_allclose(w[0, 0, 0], expected, atol=1e-6)
  # The output mixes the values: with one-hot values it reads the weights back.
  v = jnp.eye(3, 4).reshape(1, 3, 1, 4)
  out = att.dot_product_attention(q, k, v)
  np.testing.assert_allclose(out[0, 0, 0], [*expected, 0.0], atol=1e-6)


def test_masks_by_hand():
  np.testing.assert_array_equal(att.causal_mask(3)[0, 0],
                                [[1, 0, 0], [1, 1, 0], [1, 1, 1]])
  assert att.causal_mask(5).shape == (1, 1, 5, 5)

  pm = att.padding_mask(jnp.array([[1, 1, 0], [1, 0, 0]]))
  assert pm.shape == (2, 1, 1, 3) and pm.dtype == jnp.bool_
  np.testing.assert_array_equal(pm[:, 0, 0], [[True, True, False], [True, False, False]])

  dm = att.document_mask(jnp.array([[1, 1, 2, 2, 0]]))
  assert dm.shape == (1, 1, 5, 5)
  np.testing.assert_array_equal(dm[0, 0].astype(int), [
      [1, 0, 0, 0, 0],
      [1, 1, 0, 0, 0],
      [0, 0, 1, 0, 0],
      [0, 0, 1, 1, 0],
      [0, 0, 0, 0, 0],  # padding attends to nothing and nobody attends to it
  ])


def test_combine_masks():
  assert att.combine_masks() is None
  assert att.combine_masks(None, None) is None
  c = att.causal_mask(3)
  np.testing.assert_array_equal(att.combine_masks(None, c), c)
  pm = att.padding_mask(jnp.array([[1, 1, 0], [1, 1, 1]]))
  both = att.combine_masks(c, None, pm)
  assert both.shape == (2, 1, 3, 3)
  np.testing.assert_array_equal(both[0, 0], [[1, 0, 0], [1, 1, 0], [1, 1, 0]])
  np.testing.assert_array_equal(both[1, 0], [[1, 0, 0], [1, 1, 0], [1, 1, 1]])


@pytest.mark.parametrize("mask_shape", [None, (2, 3, 5, 6), (2, 1, 5, 6), (1, 1, 1, 6)])
def test_matches_float64_numpy_with_random_masks(maybe_jit, mask_shape):
  rng = np.random.default_rng(0)
  B, T, S, H, D = 2, 5, 6, 3, 8
  q, k, v = (rng.normal(size=s) for s in [(B, T, H, D), (B, S, H, D), (B, S, H, D)])
  if mask_shape is None:
    mask = np.ones((1, 1, 1, S), bool)
  else:
    mask = rng.random(mask_shape) < 0.6
    mask[..., -1, :] = False  # some fully masked rows
  with jax.enable_x64(True):
    f = maybe_jit(lambda q, k, v, m: att.dot_product_attention(q, k, v, m))
    out = f(jnp.asarray(q), jnp.asarray(k), jnp.asarray(v),
            None if mask_shape is None else jnp.asarray(mask))
    w = att.attention_weights(jnp.asarray(q), jnp.asarray(k), jnp.asarray(mask))
    assert out.dtype == jnp.float64
  ref_out, ref_w = _np_attention(q, k, v, mask)
  np.testing.assert_allclose(out, ref_out, atol=1e-12)
  np.testing.assert_allclose(w, ref_w, atol=1e-12)
  if mask_shape is not None:
    assert np.all(np.asarray(out)[:, -1] == 0.0)

  # float32 inputs: float32 math, same numbers to float32 accuracy.
  out32 = att.dot_product_attention(*(jnp.asarray(x, jnp.float32) for x in (q, k, v)),
                                    None if mask_shape is None else jnp.asarray(mask))
  assert out32.dtype == jnp.float32
  np.testing.assert_allclose(out32, ref_out, atol=1e-5)


def test_fully_masked_rows_are_zero_with_finite_gradients():
  rng = np.random.default_rng(1)
  q, k, v = (jnp.asarray(rng.normal(size=(1, 4, 2, 8)), jnp.float32) for _ in range(3))
  mask = jnp.zeros((1, 1, 4, 4), bool)
  out = att.dot_product_attention(q, k, v, mask)
  assert np.all(np.asarray(out) == 0.0)
  g = jax.jit(jax.grad(lambda q, k, v: att.dot_product_attention(q, k, v, mask).sum(),
                       argnums=(0, 1, 2)))(q, k, v)
  for gi in g:
    assert np.all(np.asarray(gi) == 0.0)
  # Padding rows of a document mask, with is_causal on top.
  seg = jnp.array([[1, 1, 0, 0]])
  out = att.dot_product_attention(q, k, v, att.document_mask(seg), is_causal=True)
  assert np.all(np.isfinite(out)) and np.all(np.asarray(out)[:, 2:] == 0.0)


def test_is_causal_equals_dense_causal_mask(maybe_jit):
  rng = np.random.default_rng(2)
  q, k, v = (jnp.asarray(rng.normal(size=(2, 6, 2, 8)), jnp.float32) for _ in range(3))
  f = maybe_jit(lambda q, k, v: att.dot_product_attention(q, k, v, is_causal=True))
  np.testing.assert_allclose(f(q, k, v), att.dot_product_attention(q, k, v, att.causal_mask(6)),
                             atol=1e-6)
  ref, _ = _np_attention(*(np.asarray(x, np.float64) for x in (q, k, v)),
                         np.tril(np.ones((6, 6), bool)))
  np.testing.assert_allclose(f(q, k, v), ref, atol=1e-5)


def _dependence(mask, is_causal, T=6):
  """[T_out, T_in] booleans: does output position t have any nonzero gradient w.r.t. input s?"""
  rng = np.random.default_rng(3)
  x = jnp.asarray(rng.normal(size=(1, T, 2, 8)), jnp.float32)
  r = jnp.asarray(rng.normal(size=(1, T, 2, 8)), jnp.float32)

  def f(x_BxTxHxD):  # q, k, v all depend on x, as in self-attention
    out = att.dot_product_attention(x_BxTxHxD, 2.0 * x_BxTxHxD, x_BxTxHxD ** 2, mask,
                                    is_causal=is_causal)
    return (out * r).sum(axis=(0, 2, 3))  # [T]

  jac_TxBxTxHxD = jax.jit(jax.jacrev(f))(x)
  return np.asarray(jnp.any(jac_TxBxTxHxD[:, 0] != 0.0, axis=(-1, -2)))


def test_causality_through_gradients():
  dep = _dependence(None, is_causal=True)
  np.testing.assert_array_equal(dep, np.tril(np.ones((6, 6), bool)))
  dep = _dependence(att.causal_mask(6), is_causal=False)
  np.testing.assert_array_equal(dep, np.tril(np.ones((6, 6), bool)))


def test_document_mask_blocks_gradients_across_documents():
  seg = np.array([1, 1, 1, 2, 2, 0])
  dep = _dependence(att.document_mask(jnp.asarray(seg)[None]), is_causal=False)
  same = (seg[:, None] == seg[None, :]) & (seg[:, None] > 0)
  expected = np.tril(same)
  np.testing.assert_array_equal(dep, expected)


def test_bf16_inputs_keep_float32_softmax():
  rng = np.random.default_rng(4)
  q, k, v = (jnp.asarray(rng.normal(size=(1, 8, 2, 16)), jnp.float32) for _ in range(3))
  ref = att.dot_product_attention(q, k, v, is_causal=True)
  qb, kb, vb = (x.astype(jnp.bfloat16) for x in (q, k, v))
  out = att.dot_product_attention(qb, kb, vb, is_causal=True, implementation="xla")
  assert out.dtype == jnp.bfloat16
  np.testing.assert_allclose(out.astype(jnp.float32), ref, atol=5e-2)
  w = att.attention_weights(qb, kb, att.causal_mask(8))
  assert w.dtype == jnp.float32
  np.testing.assert_allclose(w.sum(-1), 1.0, atol=1e-6)


def test_vmap_over_leading_axis():
  rng = np.random.default_rng(5)
  q, k, v = (jnp.asarray(rng.normal(size=(3, 2, 5, 2, 8)), jnp.float32) for _ in range(3))
  mask = att.padding_mask(jnp.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]]))
  out = jax.vmap(lambda q, k, v: att.dot_product_attention(q, k, v, mask, is_causal=True))(q, k, v)
  for i in range(3):
    np.testing.assert_allclose(
        out[i], att.dot_product_attention(q[i], k[i], v[i], mask, is_causal=True), atol=1e-6)


def test_input_validation():
  x = jnp.zeros((1, 4, 2, 8))
  with pytest.raises(ValueError, match="implementation.*'flash'"):
    att.dot_product_attention(x, x, x, implementation="flash")
  with pytest.raises(ValueError, match=r"rank 4.*\(4, 4\)"):
    att.dot_product_attention(x, x, x, jnp.ones((4, 4), bool))
  with pytest.raises(ValueError, match="is_causal.*T=1, S=4"):
    att.dot_product_attention(x[:, :1], x, x, is_causal=True)


def test_cudnn_not_selected_off_gpu():
  if jax.default_backend() == "gpu":
    pytest.skip("checks the CPU fallback")
  x = jnp.zeros((1, 4, 2, 64), jnp.bfloat16)
  assert not att.cudnn_supported(x, x, x)


_on_gpu = jax.default_backend() == "gpu"


@pytest.mark.skipif(not _on_gpu, reason="needs an NVIDIA GPU with cuDNN")
@pytest.mark.parametrize("kind", ["causal", "document", "padding"])
def test_cudnn_matches_xla_in_bf16(kind):
  B, T, H, D = 2, 128, 4, 64
  rng = np.random.default_rng(6)
  q, k, v, dout = (jnp.asarray(rng.normal(size=(B, T, H, D)), jnp.bfloat16) for _ in range(4))
  seg = np.repeat(np.array([[1, 2, 3, 0], [1, 1, 2, 0]]), T // 4, axis=1)
  mask = {"causal": None, "document": att.document_mask(jnp.asarray(seg)),
          "padding": att.padding_mask(jnp.asarray(seg > 0))}[kind]
  assert att.cudnn_supported(q, k, v, mask)

  def loss(impl, q, k, v):
    out = att.dot_product_attention(q, k, v, mask, is_causal=True, implementation=impl)
    return (out.astype(jnp.float32) * dout.astype(jnp.float32)).sum(), out

  (_, out_x), g_x = jax.jit(jax.value_and_grad(lambda *a: loss("xla", *a), argnums=(0, 1, 2),
                                               has_aux=True))(q, k, v)
  (_, out_c), g_c = jax.jit(jax.value_and_grad(lambda *a: loss("cudnn", *a), argnums=(0, 1, 2),
                                               has_aux=True))(q, k, v)
  np.testing.assert_allclose(out_c.astype(np.float32), out_x.astype(np.float32), atol=2e-2)
  for a, b in zip(g_c, g_x):
    np.testing.assert_allclose(a.astype(np.float32), b.astype(np.float32), atol=5e-2, rtol=5e-2)
  if kind == "document":   # a padding query has no key of its own document: zeroed
    assert np.all(np.asarray(out_c.astype(np.float32))[seg == 0] == 0.0)
  # implementation=None picks the fused kernel for these inputs.
  hlo = jax.jit(lambda q, k, v: att.dot_product_attention(q, k, v, mask, is_causal=True)).lower(
      q, k, v).as_text()
  assert "cudnn" in hlo
