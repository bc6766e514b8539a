"""The decoder: config validation, parameter counts by formula, causality, determinism, jit/vmap."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from andrea_jax import model as m


def _small(**kw):
  return m.tiny(**{"max_len": 16, "num_layers": 2, "d_model": 32, "num_heads": 4, "d_mlp": 64,
                   **kw})


def _tokens(B, T, vocab, seed=0):
  return jax.random.randint(jax.random.key(seed), (B, T), 0, vocab)


_init = jax.jit(m.init_params)


@functools.lru_cache(maxsize=None)
def _params(cfg, seed=0):
  return _init(cfg, jax.random.key(seed))


@jax.jit  # compiled once per (config, shapes) and shared by the tests; ModelConfig is static
def _apply(cfg, p, tokens, segment_ids=None, positions=None):
  return m.Transformer(cfg).apply({"params": p}, tokens, segment_ids=segment_ids,
                                  positions=positions)


# --- config ---------------------------------------------------------------------------------------

# A value of the wrong type is a TypeError (andrea_jax.checks), one outside the field's range a
# ValueError; either names the field and the value.
@pytest.mark.parametrize("field, value, error", [
    ("num_heads", 5, ValueError),          # does not divide d_model=128
    ("d_model", 0, ValueError),
    ("vocab_size", -3, ValueError),
    ("num_layers", 2.0, TypeError),
    ("max_len", True, TypeError),
    ("dtype", "float16", ValueError),
    ("attention_impl", "flash", ValueError),
    ("init_std", 0.0, ValueError),
    ("layer_norm_eps", -1e-5, ValueError),
    ("init_std", float("inf"), ValueError),
    ("vocab_multiple", 0, ValueError),
    ("remat", "yes", TypeError),
    ("split_qkv", 1, TypeError),
])
def test_invalid_config_names_field_and_value(field, value, error):
  with pytest.raises(error) as e:
    m.tiny(**{field: value})
  assert f"model.{field}" in str(e.value) and repr(value) in str(e.value)


def test_config_stores_numpy_numbers_as_python_ones():
  cfg = m.tiny(num_layers=np.int64(2), init_std=np.float32(0.5))
  assert type(cfg.num_layers) is int and cfg.num_layers == 2
  assert type(cfg.init_std) is float and cfg.init_std == 0.5


def test_from_dict_rejects_unknown_keys_and_round_trips():
  cfg = m.tiny(dtype="bfloat16")
  assert m.ModelConfig.from_dict(cfg.to_dict()) == cfg
  with pytest.raises(ValueError, match="d_ff.*n_heads|n_heads.*d_ff"):
    m.ModelConfig.from_dict({**cfg.to_dict(), "d_ff": 4, "n_heads": 2})
  with pytest.raises(dataclasses.FrozenInstanceError):
    cfg.d_model = 64


def test_presets():
  big = m.andrea_120m()
  assert (big.num_layers, big.num_heads, big.d_model, big.head_dim, big.d_mlp, big.max_len) == (
      12, 12, 768, 64, 3072, 1024)
  assert big.vocab_size == 50257 and big.padded_vocab_size == 50304
  t = m.tiny()
  assert (t.vocab_size, t.padded_vocab_size, t.max_len, t.num_layers, t.num_heads, t.d_model,
          t.d_mlp) == (257, 384, 256, 4, 4, 128, 512)
  assert m.andrea_120m(remat=True).remat and m.andrea_120m(remat=True).d_model == 768


def _count_by_formula(V, Lctx, L, D, F):
  layer = (2 * D            # ln_1
           + D * 3 * D + 3 * D  # fused qkv
           + D * D + D          # attention output
           + 2 * D            # ln_2
           + D * F + F          # mlp in
           + F * D + D)         # mlp out
  return V * D + Lctx * D + L * layer + 2 * D


def test_count_params_by_formula():
  assert m.count_params(_params(_small())) == _count_by_formula(384, 16, 2, 32, 64)
  tiny = jax.eval_shape(m.init_params, m.tiny(), jax.random.key(0))
  assert m.count_params(tiny) == _count_by_formula(384, 256, 4, 128, 512)
  big = jax.eval_shape(m.init_params, m.andrea_120m(), jax.random.key(0))
  n = m.count_params(big)
  assert n == _count_by_formula(50304, 1024, 12, 768, 3072)
  print(f"\nandrea_120m: {n:,} parameters ({n / 1e6:.2f}M; HF GPT-2 with 50257 rows: "
        f"{n - 47 * 768:,})")
  assert 123e6 < n < 126e6


def test_flops_per_token_is_nanogpt_estimate():
  cfg = m.andrea_120m()
  shapes = jax.eval_shape(m.init_params, cfg, jax.random.key(0))
  n_no_pos = m.count_params(shapes) - 1024 * 768
  assert m.flops_per_token(cfg, 1024) == 6 * n_no_pos + 12 * 12 * 768 * 1024
  assert m.flops_per_token(cfg, 512) == 6 * n_no_pos + 12 * 12 * 768 * 512


def test_init_statistics():
  cfg = _small()  # 2 layers
  p = _params(cfg)
  assert all(x.dtype == jnp.float32 for x in jax.tree_util.tree_leaves(p))
  np.testing.assert_allclose(np.std(p["wte"]["embedding"]), 0.02, rtol=0.05)
  np.testing.assert_allclose(np.std(p["h_0"]["attn"]["c_attn"]["kernel"]), 0.02, rtol=0.05)
  # GPT-2: residual output projections get 0.02 / sqrt(2 * num_layers) = 0.01 for 2 layers.
  np.testing.assert_allclose(np.std(p["h_0"]["mlp"]["c_proj"]["kernel"]), 0.01, rtol=0.08)
  np.testing.assert_allclose(np.std(p["h_1"]["attn"]["c_proj"]["kernel"]), 0.01, rtol=0.08)
  assert np.all(np.asarray(p["h_0"]["ln_1"]["scale"]) == 1.0)
  assert np.all(np.asarray(p["h_0"]["attn"]["c_attn"]["bias"]) == 0.0)


# --- forward --------------------------------------------------------------------------------------

def test_logits_shape_dtype_and_determinism():
  cfg = _small()
  tokens = _tokens(2, 8, cfg.vocab_size)
  logits = _apply(cfg, _params(cfg), tokens)
  assert logits.shape == (2, 8, cfg.vocab_size) and logits.dtype == jnp.float32
  again = _apply(cfg, _init(cfg, jax.random.key(0)), tokens)
  np.testing.assert_array_equal(logits, again)
  assert not np.allclose(logits, _apply(cfg, _params(cfg, seed=1), tokens))


def test_jit_and_eager_agree(maybe_jit):
  cfg = _small()
  p = _params(cfg)
  tokens = _tokens(2, 8, cfg.vocab_size)
  seg = jnp.array([[1, 1, 1, 2, 2, 2, 2, 0], [1] * 8])
  f = maybe_jit(lambda p, t, s: m.Transformer(cfg).apply({"params": p}, t, segment_ids=s))
  np.testing.assert_allclose(f(p, tokens, seg), _apply(cfg, p, tokens, seg), atol=1e-5)


def test_vmap_over_leading_axis():
  cfg = _small()
  p = _params(cfg)
  tokens_NxBxT = _tokens(3, 8, cfg.vocab_size).reshape(3, 1, 8)
  out = jax.jit(jax.vmap(lambda t: m.Transformer(cfg).apply({"params": p}, t)))(tokens_NxBxT)
  for i in range(3):
    np.testing.assert_allclose(out[i], _apply(cfg, p, tokens_NxBxT[i]), atol=1e-5)


def _dependence(cfg, segment_ids=None, T=8):
  """[T_out, T_in]: does the output at t have a nonzero gradient w.r.t. the input at s?

  The input at position s is perturbed through its position embedding row wpe[s], which the forward
  pass adds at position s only.
  """
  p = _params(cfg)
  tokens = _tokens(1, T, cfg.vocab_size)
  r = jax.random.normal(jax.random.key(1), (cfg.vocab_size,))

  def f(wpe):
    params = {**p, "wpe": {"embedding": wpe}}
    logits = m.Transformer(cfg).apply({"params": params}, tokens, segment_ids=segment_ids)
    return logits[0] @ r  # [T]

  jac_TxLxD = jax.jit(jax.jacrev(f))(p["wpe"]["embedding"])
  return np.asarray(jnp.any(jac_TxLxD[:, :T] != 0.0, axis=-1))


def test_model_causality_through_gradients():
  dep = _dependence(_small())
  np.testing.assert_array_equal(dep, np.tril(np.ones((8, 8), bool)))


def test_model_document_isolation_through_gradients():
  seg = np.array([1, 1, 1, 2, 2, 3, 0, 0])
  dep = _dependence(_small(), segment_ids=jnp.asarray(seg)[None])
  same_doc = (seg[:, None] == seg[None, :]) & (seg[:, None] > 0)
  expected = np.tril(same_doc) | np.eye(8, dtype=bool)  # padding still sees itself (residual)
  np.testing.assert_array_equal(dep, expected)


def test_single_document_and_default_positions_equal_plain_causal():
  cfg = _small()
  p = _params(cfg)
  tokens = _tokens(2, 8, cfg.vocab_size)
  np.testing.assert_allclose(
      _apply(cfg, p, tokens, jnp.ones((2, 8), jnp.int32), jnp.arange(8)[None].repeat(2, 0)),
      _apply(cfg, p, tokens), atol=1e-5)


def test_packed_documents_equal_separate_sequences():
  # Two documents packed in one row, positions restarting at each, give each document's own logits.
  cfg = _small()
  p = _params(cfg)
  a, b = _tokens(1, 5, cfg.vocab_size, seed=1), _tokens(1, 3, cfg.vocab_size, seed=2)
  packed = _apply(cfg, p, jnp.concatenate([a, b], 1), jnp.array([[1] * 5 + [2] * 3]),
                  jnp.array([[0, 1, 2, 3, 4, 0, 1, 2]]))
  np.testing.assert_allclose(packed[:, :5], _apply(cfg, p, a), atol=1e-5)
  np.testing.assert_allclose(packed[:, 5:], _apply(cfg, p, b), atol=1e-5)


def test_sown_attention_weights():
  cfg = _small()
  p = _params(cfg)
  tokens = _tokens(2, 8, cfg.vocab_size)
  logits, state = jax.jit(lambda p, t: m.Transformer(cfg).apply(
      {"params": p}, t, mutable=["intermediates"]))(p, tokens)
  np.testing.assert_allclose(logits, _apply(cfg, p, tokens), atol=1e-6)
  inter = state["intermediates"]
  assert sorted(inter) == ["h_0", "h_1"]
  (w,) = inter["h_1"]["attn"]["attention_weights"]
  assert w.shape == (2, 4, 8, 8) and w.dtype == jnp.float32
  np.testing.assert_allclose(w.sum(-1), 1.0, atol=1e-6)
  assert np.all(np.triu(np.asarray(w), k=1) == 0.0)
  # Layer 0's weights from q, k recomputed by hand out of the parameters.
  x = p["wte"]["embedding"][tokens] + p["wpe"]["embedding"][None, :8]
  mu, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
  ln = p["h_0"]["ln_1"]
  h = (x - mu) / jnp.sqrt(var + cfg.layer_norm_eps)
  h = h * ln["scale"][None, None] + ln["bias"][None, None]
  qkv = h @ p["h_0"]["attn"]["c_attn"]["kernel"] + p["h_0"]["attn"]["c_attn"]["bias"][None, None]
  q, k = qkv[..., :32].reshape(2, 8, 4, 8), qkv[..., 32:64].reshape(2, 8, 4, 8)
  causal = jnp.where(np.tril(np.ones((8, 8))), 0.0, -jnp.inf)[None, None]
  s = jnp.einsum("bthd,bshd->bhts", q, k) / np.sqrt(8) + causal
  np.testing.assert_allclose(inter["h_0"]["attn"]["attention_weights"][0],
                             jax.nn.softmax(s, -1), atol=1e-5)


def test_gradients_with_remat_and_padded_vocab_rows():
  cfg = _small()  # vocabulary 257, padded to 384
  p = _params(cfg)
  tokens = _tokens(2, 8, cfg.vocab_size)

  @jax.jit
  def loss_and_grad(cfg, p):
    loss = lambda p: jax.nn.logsumexp(m.Transformer(cfg).apply({"params": p}, tokens), -1).sum()
    return jax.value_and_grad(loss)(p)

  ref, g_ref = loss_and_grad(cfg, p)
  # The padded embedding rows never enter a softmax, so they get no gradient.
  g_wte = np.asarray(g_ref["wte"]["embedding"])
  assert g_wte.shape == (384, 32)
  assert np.all(g_wte[257:] == 0.0) and np.all(np.any(g_wte[:257] != 0.0, axis=-1))
  # Rematerialisation changes memory, not numbers.
  val, g = loss_and_grad(_small(remat=True), p)
  np.testing.assert_allclose(val, ref, rtol=1e-6)
  jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-6), g, g_ref)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_split_qkv_is_the_fused_projection_in_another_layout(dtype):
  # Three [D, D] matmuls over c_attn's column blocks against one [D, 3D] matmul sliced after: the
  # same parameters (drawn identically) and, each output being the same length-D dot product, the
  # same logits and gradients to the rounding of the compute dtype.
  split, fused = _small(dtype=dtype), _small(dtype=dtype, split_qkv=False)
  assert split.split_qkv and not fused.split_qkv
  p = _params(split)
  for a, b in zip(jax.tree.leaves(p), jax.tree.leaves(_params(fused))):
    np.testing.assert_array_equal(a, b)
  assert p["h_0"]["attn"]["c_attn"]["kernel"].shape == (32, 96)
  tokens = _tokens(2, 8, split.vocab_size)
  seg = jnp.array([[1, 1, 1, 2, 2, 2, 2, 0], [1] * 8])
  loss = lambda c: jax.jit(jax.value_and_grad(
      lambda p: _apply(c, p, tokens, seg).astype(jnp.float32).std()))(p)
  (l_s, g_s), (l_f, g_f) = loss(split), loss(fused)
  tol = 1e-6 if dtype == "float32" else 1e-2
  np.testing.assert_allclose(l_s, l_f, rtol=tol)
  for a, b in zip(jax.tree.leaves(g_s), jax.tree.leaves(g_f)):
    assert np.linalg.norm(a - b) <= tol * np.linalg.norm(b) + 1e-9


def test_hidden_output_is_what_the_logits_project():
  cfg = _small()
  p = _params(cfg)
  tokens = _tokens(2, 8, cfg.vocab_size)
  x_BxTxD = jax.jit(lambda p, t: m.Transformer(cfg).apply({"params": p}, t, hidden=True))(p, tokens)
  assert x_BxTxD.shape == (2, 8, 32) and x_BxTxD.dtype == jnp.float32
  by_hand = np.einsum("btd,vd->btv", np.float64(x_BxTxD), np.float64(p["wte"]["embedding"]))
  np.testing.assert_allclose(_apply(cfg, p, tokens), by_hand[..., :cfg.vocab_size], atol=1e-5)


def test_bf16_compute_keeps_float32_params_and_logits():
  cfg = _small()
  p = _params(cfg)
  tokens = _tokens(2, 8, cfg.vocab_size)
  bf16 = _small(dtype="bfloat16")
  logits = _apply(bf16, p, tokens)
  assert logits.dtype == jnp.float32
  np.testing.assert_allclose(logits, _apply(cfg, p, tokens), atol=2e-2)
  shapes = jax.eval_shape(m.init_params, bf16, jax.random.key(0))
  assert all(x.dtype == jnp.float32 for x in jax.tree_util.tree_leaves(shapes))


def test_bf16_embedding_gradient_is_accumulated_in_float32():
  # 4096 tokens drawn from 4 ids: each embedding row's gradient sums ~1000 contributions. A bf16
  # lookup would scatter-add them in bf16 (8 bits of mantissa) and lose part of it (7% off here);
  # in float32 the bf16 gradient is the float32 one to bf16's rounding of the activations.
  cfg = m.tiny(max_len=256, num_layers=2, d_model=32, num_heads=4, d_mlp=64)
  p = _params(cfg)
  tokens = jax.random.randint(jax.random.key(3), (16, 256), 0, 4)

  def grads(c):
    def loss(p):
      logits = _apply(c, p, tokens)
      return -jnp.mean(jax.nn.log_softmax(logits)[:, :-1, :].max(-1))
    return jax.grad(loss)(p)
  g32, g16 = grads(cfg), grads(m.tiny(max_len=256, num_layers=2, d_model=32, num_heads=4,
                                      d_mlp=64, dtype="bfloat16"))
  a, b = np.asarray(g32["wte"]["embedding"]), np.asarray(g16["wte"]["embedding"])
  assert np.linalg.norm(a - b) / np.linalg.norm(a) < 0.02
  assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(g16))


def test_cudnn_attention_needs_bf16():
  with pytest.raises(ValueError, match="attention_impl='cudnn' needs dtype='bfloat16'"):
    m.tiny(attention_impl="cudnn")
  assert m.tiny(attention_impl="cudnn", dtype="bfloat16").attention_impl == "cudnn"
