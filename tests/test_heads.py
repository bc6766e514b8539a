"""Heads as subspaces: per-head projections of the fused kernel, principal angles, overlaps."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from andrea_jax import heads
from andrea_jax.model import Transformer, init_params, tiny

# One compiled initialiser per shape (eager flax init dispatches op by op).
_init = jax.jit(init_params, static_argnums=0)


def _tilted(deg):
  """The x-y plane and the plane through x tilted by ``deg`` degrees toward z, as [3, 2] bases."""
  t = math.radians(deg)
  a = jnp.array([[1.0, 0], [0, 1], [0, 0]])
  b = jnp.array([[1.0, 0], [0, math.cos(t)], [0, math.sin(t)]])
  return a, b


def test_principal_angles_of_a_tilted_plane():
  a, b = _tilted(30.0)
  np.testing.assert_allclose(np.degrees(heads.principal_angles(a, b)), [0.0, 30.0], atol=1e-3)


def test_principal_angles_ignore_the_basis():
  # Any invertible mix of the columns spans the same plane: same angles.
  a, b = _tilted(50.0)
  mix = jnp.array([[2.0, 1.0], [-0.5, 3.0]])
  np.testing.assert_allclose(np.degrees(heads.principal_angles(a @ mix, b @ mix.T)), [0.0, 50.0],
                             atol=1e-3)


def test_orthogonal_and_equal_subspaces():
  e = jnp.eye(4)
  np.testing.assert_allclose(np.degrees(heads.principal_angles(e[:, :2], e[:, 2:])), [90, 90],
                             atol=1e-3)
  assert float(heads.subspace_overlap(e[:, :2], e[:, 2:])) == pytest.approx(0.0, abs=1e-6)
  assert float(heads.subspace_overlap(e[:, :2], e[:, :2] @ jnp.array([[1.0, 2], [3, 4]]))) == (
      pytest.approx(1.0, abs=1e-5))


def test_overlap_is_the_mean_squared_cosine():
  # cos^2 0 = 1, cos^2 30 = 3/4: mean 7/8.
  a, b = _tilted(30.0)
  assert float(heads.subspace_overlap(a, b)) == pytest.approx(0.875, abs=1e-5)


def test_subspaces_of_different_dimensions():
  # A line inside a plane: one angle, 0; overlap 1. A line at 60 degrees to a plane: cos^2 = 1/4.
  a, _ = _tilted(0.0)
  line = jnp.array([[1.0], [1.0], [0.0]])
  np.testing.assert_allclose(heads.principal_angles(a, line), [0.0], atol=1e-3)
  t = math.radians(60)
  line60 = jnp.array([[math.cos(t)], [0.0], [math.sin(t)]])
  assert float(heads.subspace_overlap(line60, a)) == pytest.approx(0.25, abs=1e-5)


def test_random_subspaces_overlap_at_k_over_d():
  # E ||Qa^T Qb||_F^2 = k * k / D for independent uniformly random k-planes of R^D. One pair per
  # call, not vmapped: a CI worker waited forever on the vmapped QR (a known XLA CPU hang).
  d, k, n = 48, 6, 300
  overlap = jax.jit(heads.subspace_overlap)
  rng = np.random.default_rng(0)
  ov = [float(overlap(*rng.normal(size=(2, d, k)).astype(np.float32))) for _ in range(n)]
  assert np.mean(ov) == pytest.approx(k / d, abs=0.01)


def test_head_projections_slice_the_fused_kernel():
  cfg = tiny(num_layers=2, num_heads=4, d_model=32, d_mlp=64, max_len=16, vocab_size=40)
  params = _init(cfg, jax.random.key(0))
  kernel = np.asarray(params["h_1"]["attn"]["c_attn"]["kernel"])          # [D, 3D]
  p = heads.head_projections(params, cfg, 1)
  dh = cfg.d_model // cfg.num_heads
  for i, name in enumerate("qkv"):
    assert p[name].shape == (4, 32, dh)
    for h in range(4):
      cols = slice(i * cfg.d_model + h * dh, i * cfg.d_model + (h + 1) * dh)
      np.testing.assert_array_equal(np.asarray(p[name][h]), kernel[:, cols])


def test_head_queries_are_what_the_model_attends_with():
  # The sown attention weights of block 0 are softmax((x Wq^h + bq)(x Wk^h + bk)^T / sqrt(Dh)) with
  # x = ln_1(embeddings): rebuilt here from the projections.
  cfg = tiny(num_layers=1, num_heads=2, d_model=16, d_mlp=32, max_len=8, vocab_size=20)
  params = _init(cfg, jax.random.key(1))
  params = jax.tree.map(lambda x: x * 20.0, params)   # far from uniform weights
  tokens = jnp.array([[3, 5, 7, 1, 2, 9]])
  _, inter = jax.jit(lambda p, t: Transformer(cfg).apply({"params": p}, t,
                                                         mutable=["intermediates"]))(params, tokens)
  att = np.asarray(inter["intermediates"]["h_0"]["attn"]["attention_weights"][0][0])  # [H, T, T]
  emb = params["wte"]["embedding"][tokens[0]] + params["wpe"]["embedding"][:6]
  ln = params["h_0"]["ln_1"]
  mu, var = emb.mean(-1, keepdims=True), emb.var(-1, keepdims=True)
  x = (emb - mu) / jnp.sqrt(var + cfg.layer_norm_eps) * ln["scale"][None] + ln["bias"][None]
  p = heads.head_projections(params, cfg, 0)
  bias = params["h_0"]["attn"]["c_attn"]["bias"].reshape(3, 2, 8)
  for h in range(2):
    q = x @ p["q"][h] + bias[0, h][None]
    k = x @ p["k"][h] + bias[1, h][None]
    s = np.asarray(q @ k.T) / math.sqrt(8)
    s = np.where(np.tril(np.ones((6, 6), bool)), s, -np.inf)
    expected = np.exp(s - s.max(-1, keepdims=True))
    expected /= expected.sum(-1, keepdims=True)
    np.testing.assert_allclose(att[h], expected, atol=2e-5)


def test_overlap_matrix_matches_pairs():
  w = jax.random.normal(jax.random.key(2), (3, 20, 4))
  m = np.asarray(heads.overlap_matrix(w))
  np.testing.assert_allclose(np.diag(m), 1.0, atol=1e-5)
  np.testing.assert_allclose(m, m.T, atol=1e-6)
  for i in range(3):
    for j in range(3):
      assert m[i, j] == pytest.approx(float(heads.subspace_overlap(w[i], w[j])), abs=1e-5)
  cross = np.asarray(heads.overlap_matrix(w, w[:, :, :2]))
  assert cross.shape == (3, 3)
  assert cross[1, 1] == pytest.approx(1.0, abs=1e-5)   # a 2-plane inside its own 4-space


def test_errors_name_the_problem():
  cfg = tiny(num_layers=1, num_heads=2, d_model=16, d_mlp=32, max_len=8, vocab_size=20)
  params = _init(cfg, jax.random.key(0))
  with pytest.raises(ValueError, match=r"head_projections: layer must be <= 0, got 1 \(a layer of "
                                       r"the model's num_layers = 1\)"):
    heads.head_projections(params, cfg, 1)
  with pytest.raises(ValueError, match=r"head_projections: layer must be >= 0, got -1"):
    heads.head_projections(params, cfg, -1)
  # A float is not a layer, even a whole one: a TypeError (andrea_jax.checks).
  with pytest.raises(TypeError, match=r"head_projections: layer must be an integer, got 0.0"):
    heads.head_projections(params, cfg, 0.0)
  with pytest.raises(ValueError, match="same D"):
    heads.principal_angles(jnp.ones((3, 1)), jnp.ones((4, 1)))
  # A subspace needs a column; a stack of heads needs three axes and one D.
  with pytest.raises(ValueError, match=r"at least one column, got \(3, 0\) and \(3, 1\)"):
    heads.subspace_overlap(jnp.ones((3, 0)), jnp.ones((3, 1)))
  with pytest.raises(ValueError, match=r"\[H, D, K\] and \[H', D, M\] with the same D"):
    heads.overlap_matrix(jnp.ones((2, 3, 1)), jnp.ones((2, 4, 1)))
  with pytest.raises(ValueError, match=r"\[H, D, K\]"):
    heads.overlap_matrix(jnp.ones((3, 1)))
