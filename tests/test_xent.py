"""The fused output projection and cross-entropy against float64 computations written out here
(numpy: the logits, a log-sum-exp over the real columns, the softmax gradient by hand), in
float64, float32 and bf16, with row blocks, weights, padded columns, jit and vmap."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from andrea_jax import xent

B, T, D, VP, V = 3, 8, 16, 40, 33     # 7 padded columns


def _inputs(seed=0, scale=1.0):
  rng = np.random.default_rng(seed)
  x = rng.normal(size=(B, T, D)) * scale
  e = rng.normal(size=(VP, D)) * 0.5
  y = rng.integers(0, V, size=(B, T))
  w = (rng.random((B, T)) > 0.25).astype(np.float64)
  w[0, :3] = (0.5, 2.0, 0.0)          # fractional weights scale a token; 0 drops it
  return x, e, y, w


def _reference(x, e, y, w, ct):
  """Loss, dX, dE, dw in float64 numpy, for the loss cotangent ``ct [B, T]``."""
  z = np.einsum("btd,vd->btv", x, e)[..., :V]                  # real columns only
  m = z.max(-1, keepdims=True)
  lse = (m + np.log(np.exp(z - m).sum(-1, keepdims=True)))[..., 0]
  label = np.take_along_axis(z, y[..., None], -1)[..., 0]
  ce = lse - label
  p = np.exp(z - lse[..., None])
  dz = (p - np.eye(V)[y]) * (ct * w)[..., None]               # [B, T, V]
  dx = np.einsum("btv,vd->btd", dz, e[:V])
  de = np.zeros_like(e)
  de[:V] = np.einsum("btv,btd->vd", dz, x)                     # padded rows: no gradient
  return w * ce, dx, de, ct * ce


def _fused(x, e, y, w, ct, **kw):
  f = lambda x, e, w: xent.cross_entropy(x, e, jnp.asarray(y), w, vocab_size=V, **kw)
  loss, vjp = jax.vjp(f, x, e, w)
  return (loss, *vjp(jnp.asarray(ct, loss.dtype)))


def _rel(a, b):
  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  return float(np.linalg.norm(a - b) / np.linalg.norm(b))


@pytest.fixture
def x64():
  jax.config.update("jax_enable_x64", True)
  yield
  jax.config.update("jax_enable_x64", False)


@pytest.mark.parametrize("block_rows", [0, 8], ids=["whole", "blocks"])
def test_float64_matches_the_reference_to_float64_rounding(x64, block_rows):
  x, e, y, w = _inputs()
  ct = np.random.default_rng(1).normal(size=(B, T))
  got = _fused(x, e, y, w, ct, dtype=jnp.float64, block_rows=block_rows)
  # Sums of at most V = 33 or B*T = 24 terms of size O(10): float64 rounding leaves ~1e-14.
  for a, b in zip(got, _reference(x, e, y, w, ct)):
    assert a.dtype == jnp.float64
    np.testing.assert_allclose(a, b, rtol=1e-11, atol=1e-12)


def test_float32_matches_float64_to_float32_rounding(x64):
  x, e, y, w = _inputs(2)
  ct = np.ones((B, T))
  args = [np.float32(a) for a in (x, e)]
  loss, dx, de, dw = _fused(*args, y, np.float32(w), ct, dtype=jnp.float32)
  ref = _reference(*[np.float64(a) for a in args], y, w, ct)
  assert loss.dtype == dx.dtype == de.dtype == jnp.float32
  # Each logit is a float32 dot of length D = 16 (error ~ 16 * 6e-8 * |x||e|), the log-sum-exp
  # and softmax are float32: 1e-5 relative leaves a margin of ~10x over that rounding.
  np.testing.assert_allclose(loss, ref[0], rtol=1e-5, atol=1e-5)
  for got, want in zip((dx, de, dw), ref[1:]):
    assert _rel(got, want) < 1e-5


def test_bf16_matmuls_with_bf16_logits_against_float64(x64):
  x, e, y, w = _inputs(3)
  ct = np.ones((B, T))
  loss, dx, de, _ = _fused(np.float32(x), np.float32(e), y, np.float32(w), ct,
                           dtype=jnp.bfloat16)
  assert loss.dtype == jnp.float32 and dx.dtype == jnp.float32 and de.dtype == jnp.float32
  # What bf16 changes, worked out in float64: the operands rounded to bf16 (8 bits of mantissa),
  # and the logits rounded to bf16 after a float32 accumulation. From those rounded logits the
  # loss is exact float32 arithmetic: it matches to float32 rounding.
  bf = lambda a: np.asarray(jnp.asarray(a, jnp.bfloat16), np.float64)
  xb, eb = bf(x), bf(e)
  z_bf16 = bf(np.einsum("btd,vd->btv", xb, eb))[..., :V]
  lse = np.log(np.exp(z_bf16).sum(-1))
  want = w * (lse - np.take_along_axis(z_bf16, y[..., None], -1)[..., 0])
  np.testing.assert_allclose(loss, want, rtol=1e-5, atol=1e-5)
  # Against the exact float64 loss: a logit |z| <= 8 here moves by at most 2^-8 |z| (operands, two
  # roundings of 2^-9 each: 0.8% of |x . e| in the worst case) plus its own rounding 2^-9 |z|, and
  # the loss (lse - z_y) by at most twice the largest change of a logit.
  ref_loss, ref_dx, ref_de, _ = _reference(x, e, y, w, ct)
  z = np.einsum("btd,vd->btv", x, e)[..., :V]
  assert np.abs(z).max() < 8
  bound = 2 * (np.abs(z_bf16 - z).max())
  assert bound < 2 * 8 * (2 * 2**-9 + 2**-9) * 1.01
  assert np.abs(np.asarray(loss) - ref_loss).max() <= bound + 1e-5
  # The gradients: the softmax of those logits (a relative change of ~ the logits' change) and dZ
  # rounded to bf16 (2^-9 relative) feed bf16-operand matmuls: a few percent of their norm.
  assert _rel(dx, ref_dx) < 3e-2 and _rel(de, ref_de) < 3e-2


def test_float32_logits_option_stores_float32_logits():
  x, e, y, w = _inputs(4)
  f = lambda logits_dtype: jax.jit(lambda x, e: xent.cross_entropy(
      x, e, y, w.astype(np.float32), vocab_size=V, dtype=jnp.bfloat16,
      logits_dtype=logits_dtype)).lower(np.float32(x), np.float32(e)).as_text()
  # The stored logits [B*T, Vp] are what the forward hands the backward (a custom_vjp residual):
  # bf16 by default, float32 on request (the matmul's float32 output is then never rounded).
  n = B * T
  assert f(None).count(f"tensor<{n}x{VP}xbf16>") > 0
  assert f("float32").count(f"tensor<{n}x{VP}xbf16>") == 0


def test_padded_columns_never_reach_the_loss_and_get_no_gradient():
  x, e, y, w = _inputs(5)
  x, e, w = np.float32(x), np.float32(e), np.float32(w)
  loss = lambda e: xent.cross_entropy(x, e, y, w, vocab_size=V).sum()
  huge = e.copy()
  huge[V:] = 1e3                     # logits of ~1e4 in the padded columns: exp would overflow
  assert float(loss(huge)) == pytest.approx(float(loss(e)), rel=1e-6)
  de = jax.grad(loss)(huge)
  assert np.isfinite(de).all() and not np.any(de[V:])
  assert np.abs(de[:V]).max() > 0


def test_weights_scale_each_token_and_zero_drops_it():
  x, e, y, w = (np.float32(a) if a.dtype.kind == "f" else a for a in _inputs(6))
  full = xent.cross_entropy(x, e, y, np.ones_like(w), vocab_size=V)
  got = xent.cross_entropy(x, e, y, w, vocab_size=V)
  np.testing.assert_allclose(got, w * full, rtol=1e-6)
  dx = jax.grad(lambda x: xent.cross_entropy(x, e, y, w, vocab_size=V).sum())(x)
  assert not np.any(dx[w == 0]) and np.abs(dx[w > 0]).min(axis=-1).max() > 0


def test_hand_worked_example():
  # x = (1, 1), rows e_0 = (1, 0), e_1 = (0, 1), padded e_2 = (5, 5): logits (1, 1, [10]),
  # softmax over the two real columns (1/2, 1/2): loss ln 2, dz = (1/2 - 1, 1/2, 0).
  x = jnp.ones((1, 1, 2))
  e = jnp.array([[1.0, 0.0], [0.0, 1.0], [5.0, 5.0]])
  f = lambda x, e: xent.cross_entropy(x, e, jnp.array([[0]]), jnp.ones((1, 1)), vocab_size=2)
  assert float(f(x, e)[0, 0]) == pytest.approx(np.log(2), rel=1e-6)
  dx, de = jax.grad(lambda x, e: f(x, e).sum(), argnums=(0, 1))(x, e)
  np.testing.assert_allclose(dx[0, 0], [-0.5, 0.5], atol=1e-7)        # dz E
  np.testing.assert_allclose(de, [[-0.5, -0.5], [0.5, 0.5], [0.0, 0.0]], atol=1e-7)   # dz^T x


def test_blocks_equal_one_block_and_jit_vmap_agree():
  x, e, y, w = (np.float32(a) if a.dtype.kind == "f" else a for a in _inputs(7))
  g = lambda br: jax.value_and_grad(lambda x, e: xent.cross_entropy(
      x, e, y, w, vocab_size=V, block_rows=br).sum(), argnums=(0, 1))(x, e)
  (l0, (dx0, de0)), (l1, (dx1, de1)) = g(0), jax.jit(g, static_argnums=0)(6)
  # Each row's loss and dX are the same computation; dE sums the blocks in another order.
  np.testing.assert_allclose(l1, l0, rtol=1e-6)
  np.testing.assert_allclose(dx1, dx0, rtol=1e-6, atol=1e-7)
  np.testing.assert_allclose(de1, de0, rtol=1e-5, atol=1e-6)
  per_row = jax.vmap(lambda x, y, w: xent.cross_entropy(x, e, y, w, vocab_size=V))(x, y, w)
  np.testing.assert_allclose(per_row, xent.cross_entropy(x, e, y, w, vocab_size=V), rtol=1e-6)


def test_bad_arguments_are_refused_with_the_value():
  x, e, y, w = (np.float32(a) if a.dtype.kind == "f" else a for a in _inputs())
  with pytest.raises(ValueError, match="block_rows = 5 does not divide the 24 tokens"):
    xent.cross_entropy(x, e, y, w, vocab_size=V, block_rows=5)
  with pytest.raises(ValueError, match="vocab_size = 41"):
    xent.cross_entropy(x, e, y, w, vocab_size=41)
  with pytest.raises(ValueError, match=r"embedding must be \[Vp, 16\]"):
    xent.cross_entropy(x, e[:, :8], y, w, vocab_size=V)
  with pytest.raises(ValueError, match="weights"):
    xent.cross_entropy(x, e, y, w[:, :4], vocab_size=V)
  with pytest.raises(ValueError, match="XentConfig.block_rows must be >= 0, got -1"):
    xent.XentConfig(block_rows=-1)
  with pytest.raises(TypeError, match="XentConfig.block_rows must be an integer, got True"):
    xent.XentConfig(block_rows=True)
  with pytest.raises(ValueError, match="XentConfig.logits_dtype.*'float16'"):
    xent.XentConfig(logits_dtype="float16")
