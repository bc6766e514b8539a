"""The real training step lowered (not run) for CUDA and for TPU at ANDREA-120M's shapes, on any
machine.

``jit_step(run.step, state_shardings, batch_sharding)`` of experiments/andrea120m.py (bf16
compute, B=64, T=1024, one device's mesh) is traced on abstract values (``jax.eval_shape``: nothing
124M-sized is allocated) and lowered for the ``cuda`` platform, with the XLA and the cuDNN
attention, with and without the document mask and remat, and for the ``tpu`` platform with the XLA
attention. A shape, dtype, sharding or lowering error of the GPU or TPU program shows here, before
a GPU or a TPU slice is lent. The dtypes of the matmuls are asserted on the lowered program: every
matmul of the blocks and every matmul over the vocabulary (the fused output projection and loss,
forward and both backward products) takes bf16 operands.

JAX lowers the cuDNN attention only after asking the CUDA plugin for the cuDNN version (at trace
time, ``jax._src.cudnn.fused_attention_stablehlo.check_cudnn_version``). Without a CUDA plugin the
unstubbed test skips and says so; the others answer that one query with cuDNN 9.10 and lower the
rest as JAX would for a GPU. On a GPU nothing is stubbed.
"""

import collections
import re

import jax
import jax.numpy as jnp
import pytest

from andrea_jax import runconfig
from andrea_jax import sharding
from andrea_jax import step as step_lib
from andrea_jax import train

B, T, L, H, DH, D, F, VP = 64, 1024, 12, 12, 64, 768, 3072, 50_304
ON_GPU = jax.default_backend() == "gpu"
STUB_CUDNN_VERSION = 91000   # cuDNN 9.10: passes every version check JAX makes in this lowering


def _lower_step(attention: str, document_mask: bool, remat: bool, platform: str = "cuda") -> str:
  """StableHLO text of the ANDREA-120M step (one device, B=64, T=1024) lowered for ``platform``."""
  from experiments import andrea120m
  c = andrea120m.get_config("v2:synthetic")
  c.data.global_batch_size, c.optim.grad_accum_steps = B, 1    # one GPU's rows, no accumulation
  c.model.attention_impl, c.model.remat = attention, remat
  c.train.document_mask = document_mask
  run = runconfig.build(c)
  mesh = sharding.make_mesh(c.mesh, devices=jax.devices()[:1])
  state = jax.eval_shape(lambda: train.init_state(run, train.run_keys(0)))
  state_sh = sharding.state_shardings(state, mesh, c.mesh.fsdp_min_size)
  batch_sh = sharding.batch_sharding(mesh)
  int_BxT = jax.ShapeDtypeStruct((B, T), jnp.int32, sharding=batch_sh)
  batch = {"inputs": int_BxT, "targets": int_BxT, "segment_ids": int_BxT, "positions": int_BxT,
           "source_ids": jax.ShapeDtypeStruct((B,), jnp.int32, sharding=batch_sh)}
  traced = step_lib.jit_step(run.step, state_sh, batch_sh).trace(state, batch)
  # On a GPU the default platform is CUDA already.
  native = platform == "cuda" and ON_GPU
  lowered = traced.lower() if native else traced.lower(lowering_platforms=(platform,))
  return lowered.as_text()


def _custom_calls(text: str) -> collections.Counter:
  return collections.Counter(re.findall(r"custom_call @([\w$]+)\(", text))


def _dot_types(text: str) -> list[tuple[str, str, str]]:
  """(lhs, rhs, result) tensor types of every dot_general, e.g. ``("64x1024x768xbf16", ...)``."""
  return re.findall(r"stablehlo\.dot_general.*: \(tensor<([^>]+)>, tensor<([^>]+)>\) -> "
                    r"tensor<([^>]+)>", text)


@pytest.fixture
def cudnn_version_query(monkeypatch):
  """Off a GPU: JAX's one question to the CUDA plugin (the cuDNN version) answered with 9.10."""
  if ON_GPU:
    return
  from jax._src.cudnn import fused_attention_stablehlo
  monkeypatch.setattr(fused_attention_stablehlo, "check_cudnn_version",
                      lambda: STUB_CUDNN_VERSION)


def _check_dense_layers_bf16(text: str, remat: bool) -> None:
  # The four dense layers of each block, q/k/v (D -> 3 x [H, Dh]: three matmuls over c_attn's
  # column blocks), (D -> D), (D -> F), (F -> D), take bf16 operands in all three of their
  # matmuls: forward, input gradient (dy W^T) and weight gradient (x^T dy, contracted over the
  # batch and time).
  weights = {f"{D}x{H}x{DH}xbf16", f"{D}x{D}xbf16", f"{D}x{F}xbf16", f"{F}x{D}xbf16"}
  dots = _dot_types(text)
  activations = [d for d in dots if d[1] in weights and d[0].startswith(f"{B}x{T}x")]
  # Forward 3 + 1 + 1 + 1, input gradients as many. Under remat the backward pass recomputes each
  # block's forward, except the MLP's output projection, whose value no gradient needs (it only
  # feeds the residual sum).
  per_layer = 6 + (5 if remat else 0) + 6
  assert len(activations) == L * per_layer, collections.Counter(activations)
  assert all(lhs.endswith("bf16") and res.endswith("bf16") for lhs, _, res in activations)
  grads = [d for d in dots if d[0].startswith(f"{B}x{T}x") and d[1].startswith(f"{B}x{T}x")
           and not d[2].startswith(f"{B}x")]
  assert len(grads) == 6 * L, collections.Counter(grads)
  assert all(lhs.endswith("bf16") and rhs.endswith("bf16") for lhs, rhs, _ in grads)
  _check_vocabulary_dots_bf16(dots)


def _check_vocabulary_dots_bf16(dots) -> None:
  # The fused output projection and loss (andrea_jax.xent): three matmuls over the padded
  # vocabulary, each on bf16 operands accumulated in float32: the logits x E^T, the input
  # gradient dZ E and the embedding's gradient dZ^T x (float32: never rounded to bf16).
  N = B * T
  vocab = [d for d in dots if any(f"{VP}x" in t for t in d)]
  assert sorted(vocab) == sorted([(f"{N}x{D}xbf16", f"{VP}x{D}xbf16", f"{N}x{VP}xf32"),
                                  (f"{N}x{VP}xbf16", f"{VP}x{D}xbf16", f"{N}x{D}xf32"),
                                  (f"{N}x{VP}xbf16", f"{N}x{D}xbf16", f"{VP}x{D}xf32")]), vocab


def _check_donated(text: str) -> None:
  # 148 parameter arrays (12 blocks x 12 + wte, wpe, ln_f scale and bias), each with AdamW's two
  # moments: the buffers of all of them are reused for the new state.
  main = text[text.index("func.func public @main("):]
  main = main[:main.index("\n")]
  assert main.count("tf.aliasing_output") >= 3 * (12 * L + 4)


@pytest.mark.parametrize("document_mask", [False, True], ids=["causal", "packed"])
@pytest.mark.parametrize("remat", [False, True], ids=["no_remat", "remat"])
def test_lower_step_for_cuda_with_cudnn_attention(cudnn_version_query, document_mask, remat):
  text = _lower_step("cudnn", document_mask, remat)
  calls = _custom_calls(text)
  # One fused kernel per layer forward (recomputed in the backward pass under remat), one backward.
  # Plain causal attention needs no mask tensor; the document mask goes as an additive bias.
  kind = "ScaleBiasSoftmax" if document_mask else "Softmax"
  assert calls[f"__cudnn$fmha{kind}"] == L * (2 if remat else 1), calls
  assert calls[f"__cudnn$fmha{kind}Backward"] == L, calls
  fmha = [line for line in text.splitlines() if f"@__cudnn$fmha{kind}(" in line]
  assert all("mask_type\\22: \\22CAUSAL" in line for line in fmha)
  qkv = f"tensor<{B}x{T}x{H}x{DH}xbf16>"
  operands = f"({qkv}, {qkv}, {qkv}" + (f", tensor<{B}x1x{T}x{T}xbf16>)" if document_mask else ")")
  assert all(operands in line for line in fmha), fmha[0][-400:]
  _check_dense_layers_bf16(text, remat)
  _check_donated(text)


@pytest.mark.parametrize("document_mask,remat", [(False, False), (True, True)],
                         ids=["causal", "packed-remat"])
def test_lower_step_for_cuda_with_xla_attention(document_mask, remat):
  text = _lower_step("xla", document_mask, remat)
  assert not any("cudnn" in name for name in _custom_calls(text))
  # q k^T per layer, bf16 q and k to float32 scores (softmax in float32), and again under remat.
  scores = (f"{B}x{T}x{H}x{DH}xbf16", f"{B}x{T}x{H}x{DH}xbf16", f"{B}x{H}x{T}x{T}xf32")
  assert _dot_types(text).count(scores) == L * (2 if remat else 1)
  _check_dense_layers_bf16(text, remat)
  _check_donated(text)


def test_lower_cudnn_attention_for_cuda_without_a_stub():
  q_BxTxHxD = jax.ShapeDtypeStruct((2, 128, 4, 64), jnp.bfloat16)

  def loss(q, k, v):
    out = jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation="cudnn")
    return out.astype(jnp.float32).sum()

  traced = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).trace
  try:
    args = (q_BxTxHxD,) * 3
    text = (traced(*args).lower() if ON_GPU
            else traced(*args).lower(lowering_platforms=("cuda",))).as_text()
  except RuntimeError as e:
    if ON_GPU:
      raise
    pytest.skip(f"JAX cannot lower the cuDNN attention for CUDA on a machine without its CUDA "
                f"plugin: jax.nn.dot_product_attention(implementation='cudnn') asks the plugin "
                f"for the cuDNN version while tracing and gets none ({e}); the stubbed tests "
                f"here answer that one query and lower the rest")
  calls = _custom_calls(text)
  assert calls["__cudnn$fmhaSoftmax"] == 1 and calls["__cudnn$fmhaSoftmaxBackward"] == 1, calls


@pytest.mark.parametrize("document_mask", [False, True], ids=["causal", "packed"])
def test_lower_step_for_tpu_with_xla_attention(document_mask):
  # What a TPU compiles: plain StableHLO (no custom call: no cuDNN, no CUDA-only kernel), the fused
  # loss's vocabulary matmuls in bf16, the state donated.
  text = _lower_step("xla", document_mask, False, platform="tpu")
  assert not _custom_calls(text), _custom_calls(text)
  _check_vocabulary_dots_bf16(_dot_types(text))
  _check_donated(text)
