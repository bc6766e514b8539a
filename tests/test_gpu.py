"""What only a GPU can check: the cuDNN attention inside the model and the training step, in bf16,
against float32 XLA; the fused output projection and loss's bf16 matmuls, as cuBLAS runs them,
against float64. Every test here skips without an NVIDIA GPU; bench/device_check.py runs them
(with tests/test_attention.py's cuDNN tests and tests/test_model.py's bf16 tests) on one.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from andrea_jax import model as m
from andrea_jax import logs
from andrea_jax import runconfig
from andrea_jax import step as step_lib
from andrea_jax import train

pytestmark = pytest.mark.skipif(
    jax.default_backend() != "gpu",
    reason=f"needs an NVIDIA GPU with cuDNN (jax's default backend here is "
           f"{jax.default_backend()!r})")

B, T = 4, 128
# Two packed documents and padding in row 0, one document in row 1, three in rows 2 and 3.
SEGMENTS_BxT = np.array([[1] * 64 + [2] * 48 + [0] * 16, [1] * 128,
                         [1] * 40 + [2] * 40 + [3] * 48, [1] * 8 + [2] * 100 + [3] * 20])


def _positions(seg_BxT: np.ndarray) -> np.ndarray:
  """Positions restarting at 0 at each document, counted independently of the model."""
  pos = np.zeros_like(seg_BxT)
  for b in range(seg_BxT.shape[0]):
    for t in range(1, seg_BxT.shape[1]):
      pos[b, t] = 0 if seg_BxT[b, t] != seg_BxT[b, t - 1] else pos[b, t - 1] + 1
  return pos


def _loss_and_grads(cfg: m.ModelConfig, params, tokens_BxT, seg_BxT):
  """Mean next-token cross-entropy over the real (segment > 0) tokens, and its gradient."""
  segment_ids = None if seg_BxT is None else jnp.asarray(seg_BxT)
  positions = None if seg_BxT is None else jnp.asarray(_positions(seg_BxT))
  real_BxT = (jnp.ones(tokens_BxT.shape) if seg_BxT is None
              else jnp.asarray(seg_BxT > 0, jnp.float32))

  def loss(p):
    logits = m.Transformer(cfg).apply({"params": p}, tokens_BxT, segment_ids=segment_ids,
                                      positions=positions)
    logp = jax.nn.log_softmax(logits[:, :-1].astype(jnp.float32))
    nll = -jnp.take_along_axis(logp, tokens_BxT[:, 1:, None], axis=-1)[..., 0]
    return (nll * real_BxT[:, 1:]).sum() / real_BxT[:, 1:].sum()
  return jax.jit(jax.value_and_grad(loss))(params)


def _rel(a, b) -> float:
  a, b = (np.concatenate([np.ravel(np.asarray(x, np.float64)) for x in jax.tree.leaves(t)])
          for t in (a, b))
  return float(np.linalg.norm(a - b) / np.linalg.norm(b))


@pytest.mark.parametrize("packed", [False, True], ids=["causal", "packed"])
def test_cudnn_model_in_bf16_matches_float32_xla(packed):
  shape = dict(vocab_size=257, max_len=T, num_layers=2, num_heads=2, d_model=128, d_mlp=256)
  f32 = m.ModelConfig(**shape, attention_impl="xla")
  cudnn = m.ModelConfig(**shape, dtype="bfloat16", attention_impl="cudnn")
  xla_bf16 = m.ModelConfig(**shape, dtype="bfloat16", attention_impl="xla")
  params = m.init_params(f32, jax.random.key(0))
  tokens_BxT = jax.random.randint(jax.random.key(1), (B, T), 0, 257)
  seg = SEGMENTS_BxT if packed else None
  # The cuDNN kernel really runs: its custom call is in the compiled program.
  hlo = jax.jit(lambda p: m.Transformer(cudnn).apply({"params": p}, tokens_BxT)).lower(
      params).compile().as_text()
  assert "cudnn$fmha" in hlo
  loss32, g32 = _loss_and_grads(f32, params, tokens_BxT, seg)
  loss_c, g_c = _loss_and_grads(cudnn, params, tokens_BxT, seg)
  loss_x, g_x = _loss_and_grads(xla_bf16, params, tokens_BxT, seg)
  assert np.isfinite(float(loss_c)) and all(np.isfinite(x).all() for x in jax.tree.leaves(g_c))
  # bf16 activations: the loss to ~1e-2 relative, the gradients to a few percent of their norm
  # (the XLA attention in bf16 is held to the same bounds: cuDNN is no worse).
  for loss, g in ((loss_c, g_c), (loss_x, g_x)):
    assert abs(float(loss) - float(loss32)) < 2e-3 * float(loss32)
    assert _rel(g, g32) < 3e-2
    # The embedding gradient (a scatter-add over every occurrence of a token) too.
    assert _rel(g["wte"]["embedding"], g32["wte"]["embedding"]) < 3e-2
    assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(g))
  # The two bf16 attentions agree with each other as closely (padding tokens, which attend to
  # nothing, included: zeros in both, never the NaN of 0/0).
  assert _rel(g_c, g_x) < 3e-2


def test_train_step_with_cudnn_in_bf16_matches_float32():
  from tests.util import small_run_config

  def one_step(**model):
    c = small_run_config()
    c.model.update(num_heads=2, d_model=128, d_mlp=256, **model)   # head_dim 64
    c.eval.sample_tokens = 0
    run = runconfig.build(c)
    state = train.init_state(run, train.run_keys(0))
    rng = np.random.default_rng(0)
    seg = np.repeat(np.array([[1, 1, 2, 2]] * 16), 8, axis=1)     # [16, 32], two documents a row
    tokens = rng.integers(0, 257, size=(16, 33)).astype(np.int32)
    batch = {"inputs": tokens[:, :-1], "targets": tokens[:, 1:], "segment_ids": seg,
             "positions": _positions(seg), "source_ids": np.arange(16, dtype=np.int32) % 16}
    fn = step_lib.jit_step(run.step)
    hlo = fn.lower(state, batch).compile().as_text()
    _, metrics = fn(state, batch)
    return metrics, "cudnn$fmha" in hlo

  m32, _ = one_step(dtype="float32", attention_impl="xla")
  m16, fused = one_step(dtype="bfloat16", attention_impl="cudnn")
  assert fused and bool(m16["finite"])
  assert abs(float(m16["loss"]) - float(m32["loss"])) < 2e-3 * float(m32["loss"])
  assert abs(float(m16["grad_norm"]) - float(m32["grad_norm"])) < 1e-2 * float(m32["grad_norm"])
  np.testing.assert_allclose(m16["source_loss"], m32["source_loss"], rtol=5e-3)


def test_peak_flops_known_for_this_gpu():
  # MFU is reported only for a device of logs.PEAK_FLOPS: an H100/H200 must be among them.
  kind = jax.devices()[0].device_kind
  if not any(name in kind for name in ("H100", "H200", "A100")):
    pytest.skip(f"{kind!r} is not the GPU the targets are set for")
  assert logs.peak_flops(jax.devices()[0]) is not None


def test_fused_loss_in_bf16_on_the_gpu_matches_float64():
  # ANDREA-120M's vocabulary and width, 256 tokens: the fused loss's bf16 matmuls as cuBLAS runs
  # them (float32 accumulation), against float64 numpy. The bound on the loss is worked out in
  # float64 as in tests/test_xent.py: twice the largest change of a logit that rounding the operands
  # and the logits to bf16 makes, plus one bf16 rounding of the largest logit for the accumulation
  # order (cuBLAS's float32 sums may round the other way at a bf16 boundary).
  import ml_dtypes
  from andrea_jax import xent
  V, VP, D, N = 50_257, 50_304, 768, 256
  rng = np.random.default_rng(0)
  x = rng.normal(size=(1, N, D)).astype(np.float32)
  e = (0.05 * rng.normal(size=(VP, D))).astype(np.float32)
  y = rng.integers(0, V, size=(1, N))
  w = np.ones((1, N), np.float32)
  f = jax.jit(jax.value_and_grad(lambda x, e: xent.cross_entropy(
      x, e, y, w, vocab_size=V, dtype=jnp.bfloat16).sum(), argnums=(0, 1)))
  loss, (dx, de) = f(x, e)
  z = np.einsum("nd,vd->nv", np.float64(x[0]), np.float64(e))[:, :V]
  lse = np.log(np.exp(z - z.max(-1, keepdims=True)).sum(-1)) + z.max(-1)
  ref = (lse - z[np.arange(N), y[0]]).sum()
  bf = lambda a: np.asarray(a.astype(ml_dtypes.bfloat16), np.float64)
  z_bf = bf(np.einsum("nd,vd->nv", bf(x[0]), bf(e))[:, :V])
  bound = 2 * (np.abs(z_bf - z).max() + 2**-8 * np.abs(z).max())
  assert abs(float(loss) - ref) <= N * bound
  assert abs(float(loss) - ref) / ref < 1e-3      # the mean loss itself: well under 0.1%
  p = np.exp(z - lse[:, None])
  p[np.arange(N), y[0]] -= 1.0
  ref_dx, ref_de = p @ np.float64(e[:V]), p.T @ np.float64(x[0])
  assert _rel(dx[0], ref_dx) < 3e-2 and _rel(de[:V], ref_de) < 3e-2
  assert not np.any(np.asarray(de[V:]))            # the padded rows: no gradient
