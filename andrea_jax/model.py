"""The ANDREA decoder: GPT-2-small's architecture, layer for layer, so Hugging Face weights convert.

Pre-LayerNorm blocks (``x + attn(ln_1(x))``, ``x + mlp(ln_2(x))``), learned position embeddings, a
fused QKV projection, a tanh-GELU MLP (HF ``gelu_new``), biases everywhere, a final LayerNorm and an
output projection tied to the token embedding. No dropout.

Parameters are float32; ``ModelConfig.dtype`` is the compute dtype (``"bfloat16"`` on accelerators).
LayerNorm statistics, attention softmax, the logits, the embedding lookups and the residual stream
are float32 in every case (the blocks compute in ``dtype`` and add their outputs in float32).

Vocabulary padding: the embedding has ``padded_vocab_size`` rows (a multiple of 128 runs the output
matmul faster), the logits are computed over all of them and the ``vocab_size`` real columns are
sliced out before returning. The padded columns therefore never reach a softmax (the loss, sampling)
and their embedding rows never receive a gradient.

Parameter tree (names follow the HF checkpoint, see :mod:`andrea_jax.convert`)::

  wte/embedding [Vp, D]   wpe/embedding [max_len, D]   ln_f/{scale, bias} [D]
  h_{i}/ln_1, h_{i}/ln_2                 {scale, bias} [D]
  h_{i}/attn/c_attn/{kernel [D, 3D], bias [3D]}   h_{i}/attn/c_proj/{kernel [D, D], bias [D]}
  h_{i}/mlp/c_fc/{kernel [D, F], bias [F]}        h_{i}/mlp/c_proj/{kernel [F, D], bias [D]}

The ``c_attn`` output is laid out ``[3 (q, k, v), H, Dh]``, as in HF. By default
(``ModelConfig.split_qkv``) q, k and v are computed as three matmuls ``x W_s + b_s`` over the
kernel's column blocks ``W_s = kernel[:, s D:(s + 1) D]`` (a free reshape of the kernel to
``[D, 3, H, Dh]``), each written straight in the ``[B, T, H, Dh]`` layout the attention takes. One
``[D, 3D]`` matmul (``split_qkv=False``) writes ``[B, T, 3, H, Dh]``, out of which q, k and v are
copied before the attention, and whose backward concatenates their gradients back (at ANDREA-120M's
B=64, T=1024 in bf16: 0.3 GB read and written per copy, about 14 GB a step over 12 layers). The
parameters, their initialisation and the Hugging Face conversion are the same either way.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from andrea_jax import attention, checks

PyTree = Any

DTYPES = ("float32", "bfloat16")
ATTENTION_IMPLS = ("auto", "xla", "cudnn")


@jax.tree_util.register_static
@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Hyper-parameters of the decoder; validated on construction.

  Hashable and registered as a static pytree (no leaves), so it can be passed straight to
  ``jax.jit``-ed functions and ``jax.eval_shape`` without ``static_argnums``.

  Attributes:
    vocab_size: number of token ids (logits have this many columns).
    max_len: context length; number of learned positions.
    num_layers: transformer blocks.
    num_heads: attention heads per block; must divide ``d_model``.
    d_model: residual stream width.
    d_mlp: hidden width of the MLP.
    dtype: compute dtype, ``"float32"`` or ``"bfloat16"`` (parameters are always float32).
    remat: rematerialise each block in the backward pass (less memory, ~1/3 more compute).
    attention_impl: ``"auto"`` (cuDNN where possible), ``"xla"`` or ``"cudnn"``.
    init_std: standard deviation of the normal initialisation.
    layer_norm_eps: LayerNorm epsilon.
    vocab_multiple: the embedding's row count is ``vocab_size`` rounded up to this.
    split_qkv: q, k and v by three matmuls over ``c_attn``'s column blocks (True), or by one
      ``[D, 3D]`` matmul and slices of its output (False; the copies that costs are in the module
      doc). Same parameters either way.
  """
  vocab_size: int
  max_len: int
  num_layers: int
  num_heads: int
  d_model: int
  d_mlp: int
  dtype: str = "float32"
  remat: bool = False
  attention_impl: str = "auto"
  init_std: float = 0.02
  layer_norm_eps: float = 1e-5
  vocab_multiple: int = 128
  split_qkv: bool = True

  def __post_init__(self):
    # Each field checked under its config name (the run's model section), stored as checked (a
    # numpy integer becomes an int: the config goes to JSON).
    for name in ("vocab_size", "max_len", "num_layers", "num_heads", "d_model", "d_mlp",
                 "vocab_multiple"):
      object.__setattr__(self, name, checks.integer(f"model.{name}", getattr(self, name),
                                                    minimum=1))
    if self.d_model % self.num_heads != 0:
      raise ValueError(f"model.num_heads={self.num_heads} does not divide "
                       f"model.d_model={self.d_model}")
    checks.choice("model.dtype", self.dtype, DTYPES)
    checks.choice("model.attention_impl", self.attention_impl, ATTENTION_IMPLS)
    if self.attention_impl == "cudnn" and self.dtype != "bfloat16":
      raise ValueError(f"model.attention_impl='cudnn' needs dtype='bfloat16' (cuDNN's fused "
                       f"attention takes fp16/bf16 only); got dtype={self.dtype!r}: use 'auto', "
                       "which falls back to XLA in float32")
    for name in ("remat", "split_qkv"):
      object.__setattr__(self, name, checks.flag(f"model.{name}", getattr(self, name)))
    for name in ("init_std", "layer_norm_eps"):
      object.__setattr__(self, name, checks.number(f"model.{name}", getattr(self, name), low=0,
                                                   low_open=True))

  @property
  def padded_vocab_size(self) -> int:
    """``vocab_size`` rounded up to a multiple of ``vocab_multiple`` (50257 -> 50304)."""
    m = self.vocab_multiple
    return (self.vocab_size + m - 1) // m * m

  @property
  def head_dim(self) -> int:
    """``d_k = d_model / num_heads`` (64 for ANDREA-120M)."""
    return self.d_model // self.num_heads

  @property
  def compute_dtype(self) -> jnp.dtype:
    return jnp.dtype(self.dtype)

  @classmethod
  def from_dict(cls, d: dict[str, Any]) -> "ModelConfig":
    """Builds a config from a mapping; unknown keys raise ``ValueError`` naming them."""
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(d) - known)
    if unknown:
      raise ValueError(f"unknown ModelConfig field(s): {', '.join(unknown)}; "
                       f"known fields are: {', '.join(sorted(known))}")
    return cls(**d)

  def to_dict(self) -> dict[str, Any]:
    return dataclasses.asdict(self)


def andrea_120m(**overrides: Any) -> ModelConfig:
  """ANDREA-120M = GPT-2 small: 12 layers, 12 heads, d_model 768 (d_k 64), MLP 3072, context 1024,
  GPT-2 vocabulary 50257 (padded to 50304). About 124M parameters."""
  base = dict(vocab_size=50257, max_len=1024, num_layers=12, num_heads=12, d_model=768,
              d_mlp=3072)
  return ModelConfig(**{**base, **overrides})


def tiny(**overrides: Any) -> ModelConfig:
  """A CPU-sized model for tests and the demo: byte vocabulary (256 bytes + end-of-document = 257),
  context 256, 4 layers, 4 heads, d_model 128, MLP 512."""
  base = dict(vocab_size=257, max_len=256, num_layers=4, num_heads=4, d_model=128, d_mlp=512)
  return ModelConfig(**{**base, **overrides})


def _dense(features: int, std: float, dtype, name: str) -> nn.Dense:
  return nn.Dense(features, dtype=dtype, param_dtype=jnp.float32, name=name,
                  kernel_init=nn.initializers.normal(std), bias_init=nn.initializers.zeros)


def _layer_norm(config: ModelConfig, name: str) -> nn.LayerNorm:
  # Exact two-pass variance: matches torch's LayerNorm to float32 rounding.
  return nn.LayerNorm(epsilon=config.layer_norm_eps, dtype=config.compute_dtype,
                      use_fast_variance=False, name=name)


class QkvProjection(nn.Module):
  """``c_attn``: q, k, v ``[B, T, H, Dh]`` each, from ``x [B, T, D]`` and one ``[D, 3D]`` kernel.

  The parameters are ``nn.Dense(3D)``'s (``kernel [D, 3D]``, ``bias [3D]``, the same initialisers
  drawn in the same order, so the same values for a key), and so is the arithmetic of each output:
  operands cast to the compute dtype, a matmul of length ``D``, the bias added in that dtype.
  ``split_qkv`` picks three ``[D, D]`` matmuls over the column blocks or one ``[D, 3D]`` matmul
  and slices (see the module doc).
  """
  config: ModelConfig

  @nn.compact
  def __call__(self, x_BxTxD: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    cfg = self.config
    B, T, D = x_BxTxD.shape
    H, Dh = cfg.num_heads, cfg.head_dim
    kernel_Dx3D = self.param("kernel", nn.initializers.normal(cfg.init_std), (D, 3 * D),
                             jnp.float32)
    bias_3D = self.param("bias", nn.initializers.zeros, (3 * D,), jnp.float32)
    x, kernel_Dx3D, bias_3D = (a.astype(cfg.compute_dtype) for a in (x_BxTxD, kernel_Dx3D, bias_3D))
    if not cfg.split_qkv:
      qkv_BxTx3D = jnp.einsum("btd,df->btf", x, kernel_Dx3D) + bias_3D.reshape(1, 1, 3 * D)
      qkv_BxTx3xHxDh = qkv_BxTx3D.reshape(B, T, 3, H, Dh)
      return tuple(qkv_BxTx3xHxDh[:, :, i] for i in range(3))
    kernel_Dx3xHxDh = kernel_Dx3D.reshape(D, 3, H, Dh)
    bias_3x1x1xHxDh = bias_3D.reshape(3, 1, 1, H, Dh)
    return tuple(jnp.einsum("btd,dhk->bthk", x, kernel_Dx3xHxDh[:, i]) + bias_3x1x1xHxDh[i]
                 for i in range(3))


class CausalSelfAttention(nn.Module):
  """Multi-head self-attention with one fused QKV projection; optional KV cache (``decode``)."""
  config: ModelConfig
  decode: bool = False

  @nn.compact
  def __call__(self, x_BxTxD: jax.Array, mask: jax.Array | None,
               cache_index: jax.Array | None) -> jax.Array:
    cfg = self.config
    B, T, D = x_BxTxD.shape
    H, Dh = cfg.num_heads, cfg.head_dim
    q, k, v = QkvProjection(cfg, name="c_attn")(x_BxTxD)  # each [B, T, H, Dh]

    is_causal = True
    if self.decode:
      # Write this chunk's keys/values at cache_index; attend over the whole cache with the mask the
      # caller built (key s visible to query t iff s <= cache_index + t).
      shape = (B, cfg.max_len, H, Dh)
      cached_k = self.variable("cache", "cached_key", jnp.zeros, shape, cfg.compute_dtype)
      cached_v = self.variable("cache", "cached_value", jnp.zeros, shape, cfg.compute_dtype)
      start = (0, cache_index, 0, 0)
      cached_k.value = jax.lax.dynamic_update_slice(cached_k.value, k.astype(cached_k.value.dtype),
                                                    start)
      cached_v.value = jax.lax.dynamic_update_slice(cached_v.value, v.astype(cached_v.value.dtype),
                                                    start)
      k, v = cached_k.value, cached_v.value  # [B, max_len, H, Dh]
      is_causal = False

    # Decoding reads one query against the whole cache, a shape the fused kernel may reject: auto.
    impl = None if (cfg.attention_impl == "auto" or self.decode) else cfg.attention_impl
    y_BxTxHxDh = attention.dot_product_attention(q, k, v, mask, is_causal=is_causal,
                                                 implementation=impl)
    if self.is_mutable_collection("intermediates"):
      full_mask = attention.combine_masks(mask, attention.causal_mask(T) if is_causal else None)
      self.sow("intermediates", "attention_weights", attention.attention_weights(q, k, full_mask))

    proj_std = cfg.init_std / math.sqrt(2 * cfg.num_layers)  # GPT-2's scaled residual init
    return _dense(D, proj_std, cfg.compute_dtype, "c_proj")(y_BxTxHxDh.reshape(B, T, D))


class Mlp(nn.Module):
  """``c_proj(gelu_tanh(c_fc(x)))``."""
  config: ModelConfig

  @nn.compact
  def __call__(self, x_BxTxD: jax.Array) -> jax.Array:
    cfg = self.config
    h_BxTxF = _dense(cfg.d_mlp, cfg.init_std, cfg.compute_dtype, "c_fc")(x_BxTxD)
    h_BxTxF = jax.nn.gelu(h_BxTxF, approximate=True)  # HF "gelu_new"
    proj_std = cfg.init_std / math.sqrt(2 * cfg.num_layers)
    return _dense(cfg.d_model, proj_std, cfg.compute_dtype, "c_proj")(h_BxTxF)


class Block(nn.Module):
  """Pre-LayerNorm transformer block: ``x += attn(ln_1(x)); x += mlp(ln_2(x))``."""
  config: ModelConfig
  decode: bool = False

  @nn.compact
  def __call__(self, x_BxTxD: jax.Array, mask: jax.Array | None,
               cache_index: jax.Array | None) -> jax.Array:
    cfg = self.config
    h = _layer_norm(cfg, "ln_1")(x_BxTxD)
    x_BxTxD = x_BxTxD + CausalSelfAttention(cfg, self.decode, name="attn")(h, mask, cache_index)
    h = _layer_norm(cfg, "ln_2")(x_BxTxD)
    return x_BxTxD + Mlp(cfg, name="mlp")(h)


class Transformer(nn.Module):
  """Decoder-only language model: ``tokens [B, T] -> logits [B, T, vocab_size]`` (float32).

  Call: ``model.apply({'params': params}, tokens_BxT, segment_ids=None, positions=None)``.

  * ``segment_ids [B, T]``: document ids (> 0) of packed sequences, 0 for padding; attention then
    uses :func:`attention.document_mask` (no attention across documents). Without them attention is
    plain causal.
  * ``positions [B, T]``: position ids, ``arange(T)`` by default (a data pipeline may restart them
    at each document).
  * ``decode=True``: incremental decoding with a KV cache in the ``'cache'`` collection (apply with
    ``mutable=['cache']``); the tokens continue where the cache stopped. See :mod:`generate`.
  * Applied with ``mutable=['intermediates']``, every block sows its attention weights
    ``[B, H, T, S]`` under ``intermediates/h_{i}/attn/attention_weights``.
  * ``hidden=True``: return the final LayerNorm's output ``[B, T, D]`` (compute dtype) instead of
    the logits: what the fused output projection and loss (:func:`andrea_jax.xent.cross_entropy`)
    takes, with ``params['wte']['embedding']``, so that the logits are never built here.

  Example:
    >>> cfg = tiny()
    >>> params = init_params(cfg, jax.random.key(0))
    >>> logits = Transformer(cfg).apply({'params': params}, tokens_BxT)   # [B, T, 257]
  """
  config: ModelConfig

  @nn.compact
  def __call__(self, tokens_BxT: jax.Array, segment_ids: jax.Array | None = None,
               positions: jax.Array | None = None, *, decode: bool = False,
               hidden: bool = False) -> jax.Array:
    cfg = self.config
    if jnp.ndim(tokens_BxT) != 2:
      raise ValueError(f"tokens must be [batch, length]; got shape {jnp.shape(tokens_BxT)}")
    B, T = tokens_BxT.shape
    if T > cfg.max_len:   # the position table has max_len rows: a longer row would read NaN
      raise ValueError(f"sequence length {T} exceeds config.max_len = {cfg.max_len}")
    init = nn.initializers.normal(cfg.init_std)
    # The lookups and the residual stream stay float32 under bf16 compute (the blocks' bf16 outputs
    # are added to it in float32): a bf16 lookup would accumulate the embedding gradient, a
    # scatter-add over every occurrence of a token, in bf16, losing most of a frequent token's.
    wte = nn.Embed(cfg.padded_vocab_size, cfg.d_model, dtype=jnp.float32, embedding_init=init,
                   name="wte")
    wpe = nn.Embed(cfg.max_len, cfg.d_model, dtype=jnp.float32, embedding_init=init, name="wpe")

    cache_index = None
    if decode:
      if segment_ids is not None:
        raise ValueError("segment_ids are not supported with decode=True")
      index = self.variable("cache", "index", lambda: jnp.zeros((), jnp.int32))
      cache_index = index.value
      if positions is None:
        positions = cache_index + jnp.arange(T)[None]
      # Query t sits at absolute position cache_index + t and sees cached keys up to there.
      key_pos_1xS = jnp.arange(cfg.max_len)[None]
      query_pos_Tx1 = cache_index + jnp.arange(T)[:, None]
      mask = (key_pos_1xS <= query_pos_Tx1)[None, None]  # [1, 1, T, max_len]
      index.value = cache_index + T
    else:
      mask = None if segment_ids is None else attention.document_mask(segment_ids)
      if positions is None:
        positions = jnp.arange(T)[None]

    x_BxTxD = wte(tokens_BxT) + wpe(positions)
    block_cls = nn.remat(Block) if (cfg.remat and not decode) else Block
    for i in range(cfg.num_layers):
      x_BxTxD = block_cls(cfg, decode, name=f"h_{i}")(x_BxTxD, mask, cache_index)
    x_BxTxD = _layer_norm(cfg, "ln_f")(x_BxTxD)
    if hidden:
      return x_BxTxD

    # Tied output projection, accumulated in float32 so the logits keep full precision in bf16.
    logits_BxTxVp = jnp.einsum("btd,vd->btv", x_BxTxD,
                               wte.embedding.astype(cfg.compute_dtype),
                               preferred_element_type=jnp.float32)
    return logits_BxTxVp[..., :cfg.vocab_size]


def init_params(config: ModelConfig, key: jax.Array) -> PyTree:
  """Fresh float32 parameters: normal(init_std), residual projections normal(init_std/sqrt(2L)),
  LayerNorm scale 1, biases 0.

  Jittable (``jax.jit(init_params)``; the config is static) and usable with ``jax.eval_shape`` for
  an abstract init.

  Example:
    >>> params = init_params(tiny(), jax.random.key(0))
    >>> shapes = jax.eval_shape(init_params, andrea_120m(), jax.random.key(0))
  """
  tokens_1x1 = jnp.zeros((1, 1), jnp.int32)
  return Transformer(config).init(key, tokens_1x1)["params"]


def count_params(params: PyTree) -> int:
  """Total number of parameter scalars (the padded embedding rows included)."""
  return int(sum(math.prod(x.shape) for x in jax.tree_util.tree_leaves(params)))


def flops_per_token(config: ModelConfig, seq_len: int) -> float:
  """Training FLOPs per token (forward + backward), nanoGPT's MFU estimate: ``6 N + 12 L d T``.

  ``N`` counts the parameters without the position embedding; the tied token embedding is counted
  once (it performs the output matmul), with its padded rows since that matmul runs over them.
  ``12 L d T`` is the attention's ``q k^T`` and ``weights v`` matmuls (forward + backward).

  Example:
    >>> flops_per_token(andrea_120m(), 1024) / 1e9   # ~0.85 GFLOP per token
  """
  d, f, L = config.d_model, config.d_mlp, config.num_layers
  per_block = 4 * d + (d * 3 * d + 3 * d) + (d * d + d) + (d * f + f) + (f * d + d)
  n = config.padded_vocab_size * d + L * per_block + 2 * d
  return float(6 * n + 12 * L * d * seq_len)
