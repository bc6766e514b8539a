"""Weights to and from the Hugging Face GPT-2 layout (``transformers.GPT2LMHeadModel``).

The architectures match layer for layer (see :mod:`andrea_jax.model`), so conversion is renaming:

=======================================  ============================================
HF name (``N`` = layer)                  ours
=======================================  ============================================
``transformer.wte.weight [V, D]``         ``wte/embedding [Vp, D]`` (rows padded)
``transformer.wpe.weight``                ``wpe/embedding``
``transformer.h.N.ln_1.weight / .bias``   ``h_N/ln_1/scale / bias`` (same for ln_2, ln_f)
``transformer.h.N.attn.c_attn.weight``    ``h_N/attn/c_attn/kernel`` (HF Conv1D is [in, out] too)
``transformer.h.N.mlp.c_fc.weight``       ``h_N/mlp/c_fc/kernel`` (same for every c_* layer)
``lm_head.weight``                        tied to ``wte``: exported, checked on import
=======================================  ============================================

Vocabulary padding: HF holds ``[vocab_size, D]``; we pad the embedding with zero rows on import and
cut the padding on export.

Example:
  >>> save_safetensors(params, cfg, "out/andrea")  # out/andrea/{model.safetensors,config.json}
  >>> hf = transformers.GPT2LMHeadModel.from_pretrained("out/andrea")
  >>> params = load_safetensors("out/andrea", cfg)
"""

from __future__ import annotations

import json
import os
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import safetensors.numpy

from andrea_jax import checks
from andrea_jax.model import ModelConfig, PyTree, init_params

_SAFETENSORS_NAME = "model.safetensors"
# Non-parameter buffers older transformers versions store in GPT-2 checkpoints (the causal mask).
_IGNORED_SUFFIXES = (".attn.bias", ".attn.masked_bias")
_BLOCK_LAYERS = {  # HF module -> our module path inside h_N
    "ln_1": ("ln_1",), "ln_2": ("ln_2",),
    "attn.c_attn": ("attn", "c_attn"), "attn.c_proj": ("attn", "c_proj"),
    "mlp.c_fc": ("mlp", "c_fc"), "mlp.c_proj": ("mlp", "c_proj"),
}


def _name_map(config: ModelConfig) -> dict[str, tuple[str, ...]]:
  """HF tensor name -> our parameter path, for every tensor except the tied ``lm_head.weight``."""
  names = {
      "transformer.wte.weight": ("wte", "embedding"),
      "transformer.wpe.weight": ("wpe", "embedding"),
      "transformer.ln_f.weight": ("ln_f", "scale"),
      "transformer.ln_f.bias": ("ln_f", "bias"),
  }
  for i in range(config.num_layers):
    for hf_module, ours in _BLOCK_LAYERS.items():
      is_norm = hf_module.startswith("ln_")
      names[f"transformer.h.{i}.{hf_module}.weight"] = (f"h_{i}", *ours,
                                                         "scale" if is_norm else "kernel")
      names[f"transformer.h.{i}.{hf_module}.bias"] = (f"h_{i}", *ours, "bias")
  return names


def _hf_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
  """Expected HF shape of every tensor: ours, with the vocabulary unpadded."""
  ours = jax.eval_shape(init_params, config, jax.random.key(0))
  shapes = {}
  for hf, path in _name_map(config).items():
    shape = tuple(_get(ours, path).shape)
    shapes[hf] = (config.vocab_size, shape[1]) if hf == "transformer.wte.weight" else shape
  return shapes


def tensor_problems(shapes: dict[str, tuple[int, ...]], config: ModelConfig) -> list[str]:
  """Every way a GPT-2 checkpoint's tensors (``name -> shape``, HF names with or without the
  ``transformer.`` prefix) differ from what ``config`` needs: each missing tensor, each unexpected
  one, each of the wrong shape, one line apiece (``[]`` when it loads). The causal-mask buffers of
  older files and a tied ``lm_head.weight`` of the embedding's shape are accepted.

  Example:
    >>> tensor_problems({"wte.weight": (50257, 768)}, cfg)[:1]
    ['missing tensor transformer.wpe.weight (expected shape (1024, 768))']
  """
  have = {}
  for name, shape in shapes.items():
    if name.endswith(_IGNORED_SUFFIXES):
      continue
    have[name if name.startswith(("transformer.", "lm_head.")) else "transformer." + name] = (
        tuple(shape))
  want = _hf_shapes(config)
  want["lm_head.weight"] = want["transformer.wte.weight"]
  out = [f"missing tensor {n} (expected shape {want[n]})" for n in want
         if n not in have and n != "lm_head.weight"]
  out += [f"unexpected tensor {n} {have[n]}" for n in have if n not in want]
  out += [f"tensor {n} has shape {have[n]}, expected {want[n]}" for n in want
          if n in have and have[n] != want[n]]
  return out


def model_config_from_hf(hf_config: dict[str, Any], where: str = "config.json",
                         **overrides: Any) -> ModelConfig:
  """The :class:`ModelConfig` of a ``transformers`` GPT-2 ``config.json`` (the inverse of
  :func:`hf_gpt2_config`): ``n_layer``, ``n_head``, ``n_embd``, ``n_inner`` (``None``: ``4 *
  n_embd``), ``n_positions``, ``vocab_size``, ``layer_norm_epsilon``, ``initializer_range``.
  ``overrides`` set other fields (``dtype``, ...).

  Raises ``ValueError`` naming ``where`` and the field for a model this one does not compute:
  another ``model_type``, an activation other than ``gelu_new``, unscaled or layer-scaled
  attention, untied output embeddings.

  Example:
    >>> model_config_from_hf(json.load(open("gpt2/config.json"))).num_layers
    12
  """
  def need(key, ok, want):
    if key in hf_config and not ok(hf_config[key]):
      raise ValueError(f"{where}: {key} = {hf_config[key]!r}; this model computes {want} "
                       "(GPT-2's architecture)")

  need("model_type", lambda v: v == "gpt2", "'gpt2'")
  need("activation_function", lambda v: v in ("gelu_new", "gelu_pytorch_tanh"), "'gelu_new'")
  need("scale_attn_weights", lambda v: v is True, "True")
  need("scale_attn_by_inverse_layer_idx", lambda v: v is False, "False")
  need("tie_word_embeddings", lambda v: v is True, "True (the output layer is the embedding)")
  fields = {"vocab_size": "vocab_size", "max_len": "n_positions", "num_layers": "n_layer",
            "num_heads": "n_head", "d_model": "n_embd"}
  missing = [hf for hf in fields.values() if not isinstance(hf_config.get(hf), int)]
  if missing:
    raise ValueError(f"{where}: no integer {', '.join(missing)} (not a GPT-2 config.json)")
  d = {ours: hf_config[hf] for ours, hf in fields.items()}
  d["d_mlp"] = hf_config.get("n_inner") or 4 * d["d_model"]
  d["layer_norm_eps"] = float(hf_config.get("layer_norm_epsilon", 1e-5))
  d["init_std"] = float(hf_config.get("initializer_range", 0.02))
  try:
    return ModelConfig(**{**d, **overrides})
  except ValueError as e:
    raise ValueError(f"{where}: {e}") from e


def _get(tree, path):
  for p in path:
    tree = tree[p]
  return tree


def _to_numpy(x: Any) -> np.ndarray:
  if hasattr(x, "detach"):  # a torch tensor (possibly bf16, which numpy cannot hold)
    x = x.detach().cpu().float().numpy()
  return np.asarray(x, dtype=np.float32)


def to_hf_state_dict(params: PyTree, config: ModelConfig) -> dict[str, np.ndarray]:
  """Our parameters as a float32 HF ``GPT2LMHeadModel`` state dict (``lm_head.weight`` included,
  equal to ``transformer.wte.weight``); the padded vocabulary rows are cut.

  Example:
    >>> sd = to_hf_state_dict(params, cfg)
    >>> hf_model.load_state_dict({k: torch.from_numpy(v) for k, v in sd.items()})
  """
  expected = jax.eval_shape(init_params, config, jax.random.key(0))
  paths = lambda tree: {"/".join(str(getattr(k, "key", k)) for k in kp)
                        for kp, _ in jax.tree_util.tree_flatten_with_path(tree)[0]}
  extra = sorted(paths(params) - paths(expected))
  if extra:   # a 4-layer tree under a 2-layer config would otherwise export a truncated model
    raise ValueError(f"params has parameter(s) the config does not name: {extra[:4]}"
                     f"{' ...' if len(extra) > 4 else ''}; pass the config the params were made "
                     "with")
  out = {}
  for hf, path in _name_map(config).items():
    try:
      value = _to_numpy(_get(params, path))
    except (KeyError, TypeError):
      raise ValueError(f"params has no {'/'.join(path)} (for {hf})") from None
    want = tuple(_get(expected, path).shape)
    if value.shape != want:
      raise ValueError(f"params {'/'.join(path)} has shape {value.shape}; config expects {want}")
    out[hf] = value
  out["transformer.wte.weight"] = out["transformer.wte.weight"][:config.vocab_size]
  out["lm_head.weight"] = out["transformer.wte.weight"]
  return out


def from_hf_state_dict(state_dict: dict[str, Any], config: ModelConfig) -> PyTree:
  """Our parameters (float32 ``jax.Array`` tree) from an HF GPT-2 state dict.

  Accepts ``GPT2LMHeadModel.state_dict()`` (torch tensors or numpy arrays) and the hub layout
  without the ``transformer.`` prefix. Checks every name and shape and raises ``ValueError``
  naming the offending tensor; ``lm_head.weight``, when present, must equal the token embedding
  (tied). The embedding is padded with zero rows up to ``config.padded_vocab_size``.
  """
  sd = {}
  for name, value in state_dict.items():
    if name.endswith(_IGNORED_SUFFIXES):
      continue
    if not name.startswith(("transformer.", "lm_head.")):
      name = "transformer." + name
    sd[name] = value

  names = _name_map(config)
  shapes = _hf_shapes(config)
  missing = sorted(set(names) - set(sd))
  if missing:
    raise ValueError(f"state dict lacks {len(missing)} tensor(s): {', '.join(missing[:8])}")
  unknown = sorted(set(sd) - set(names) - {"lm_head.weight"})
  if unknown:
    raise ValueError(f"state dict has unexpected tensor(s): {', '.join(unknown[:8])}")

  params: dict = {}
  for hf, path in names.items():
    value = _to_numpy(sd[hf])
    if value.shape != shapes[hf]:
      raise ValueError(f"tensor {hf} has shape {value.shape}; config expects {shapes[hf]}")
    if hf == "transformer.wte.weight":
      pad = config.padded_vocab_size - config.vocab_size
      value = np.concatenate([value, np.zeros((pad, value.shape[1]), np.float32)])
    node = params
    for p in path[:-1]:
      node = node.setdefault(p, {})
    node[path[-1]] = jnp.asarray(value)

  if "lm_head.weight" in sd:
    lm_head = _to_numpy(sd["lm_head.weight"])
    if not np.array_equal(lm_head, _to_numpy(sd["transformer.wte.weight"])):
      raise ValueError("tensor lm_head.weight differs from transformer.wte.weight: untied output "
                       "embeddings cannot be represented (the model ties them)")
  return params


def hf_gpt2_config(config: ModelConfig, eod_id: int | None = None) -> dict[str, Any]:
  """The ``transformers.GPT2Config`` (as a ``config.json`` dict) of the same model.

  Dropout is 0 (we train without it). BOS and EOS are ``eod_id``, the tokenizer's end-of-document
  id (``tokenizer.eod_id``); by default the last id, which is the byte tokenizer's and GPT-2's
  ``<|endoftext|>`` but not a BPE trained here (``train_bpe`` puts it at 0): pass it. The
  tokenizer itself is not exported.
  """
  eod = config.vocab_size - 1 if eod_id is None else eod_id
  eod = checks.integer("hf_gpt2_config: eod_id", eod, minimum=0, maximum=config.vocab_size - 1,
                       hint=f"a token id below the model's vocab_size = {config.vocab_size}")
  return {
      "architectures": ["GPT2LMHeadModel"],
      "model_type": "gpt2",
      "vocab_size": config.vocab_size,
      "n_positions": config.max_len,
      "n_embd": config.d_model,
      "n_layer": config.num_layers,
      "n_head": config.num_heads,
      "n_inner": config.d_mlp,
      "activation_function": "gelu_new",
      "layer_norm_epsilon": config.layer_norm_eps,
      "initializer_range": config.init_std,
      "resid_pdrop": 0.0,
      "embd_pdrop": 0.0,
      "attn_pdrop": 0.0,
      "scale_attn_weights": True,
      "tie_word_embeddings": True,
      "bos_token_id": eod,
      "eos_token_id": eod,
      "dtype": "float32",
  }


def _resolve(path: str | os.PathLike) -> tuple[str, str]:
  """(directory, safetensors file) for a directory or a ``.safetensors`` file path."""
  path = os.fspath(path)
  if path.endswith(".safetensors"):
    return os.path.dirname(path) or ".", path
  return path, os.path.join(path, _SAFETENSORS_NAME)


def save_safetensors(params: PyTree, config: ModelConfig, path: str | os.PathLike, *,
                     eod_id: int | None = None) -> str:
  """Writes the HF state dict as safetensors plus an HF ``config.json`` beside it.

  ``path`` is a directory (gets ``model.safetensors``, which
  ``GPT2LMHeadModel.from_pretrained(dir)`` finds) or a ``.safetensors`` file. The tied
  ``lm_head.weight`` is stored once, as ``wte`` (HF re-ties on load). ``eod_id``: the tokenizer's
  end-of-document id, HF's BOS and EOS (:func:`hf_gpt2_config`). Returns the path of the
  safetensors file.
  """
  directory, file = _resolve(path)
  hf_config = hf_gpt2_config(config, eod_id)   # checks eod_id before anything is written
  os.makedirs(directory, exist_ok=True)
  tensors = to_hf_state_dict(params, config)
  del tensors["lm_head.weight"]
  safetensors.numpy.save_file(tensors, file, metadata={"format": "pt"})
  with open(os.path.join(directory, "config.json"), "w") as f:
    json.dump(hf_config, f, indent=2)
  return file


def load_safetensors(path: str | os.PathLike, config: ModelConfig) -> PyTree:
  """Loads HF GPT-2 safetensors weights (a directory or a file) into our parameter tree.

  When a ``config.json`` lies beside the file, its architecture fields must match ``config``.
  """
  directory, file = _resolve(path)
  config_file = os.path.join(directory, "config.json")
  if os.path.exists(config_file):
    with open(config_file) as f:
      theirs = json.load(f)
    ours = hf_gpt2_config(config)
    if theirs.get("n_inner") is None:  # HF's default MLP width
      theirs["n_inner"] = 4 * theirs.get("n_embd", 0)
    for key in ("vocab_size", "n_positions", "n_embd", "n_layer", "n_head", "n_inner",
                "activation_function", "layer_norm_epsilon"):
      if key in theirs and theirs[key] != ours[key]:
        raise ValueError(f"{config_file}: {key}={theirs[key]!r} but the ModelConfig gives "
                         f"{ours[key]!r}")
    # Attention variants GPT-2's config allows and this model does not compute.
    for key, ours_value in (("scale_attn_weights", True),
                            ("scale_attn_by_inverse_layer_idx", False)):
      if key in theirs and theirs[key] != ours_value:
        raise ValueError(f"{config_file}: {key}={theirs[key]!r}; this model's attention has "
                         f"{key}={ours_value!r} (the weights would load and compute other logits)")
  return from_hf_state_dict(safetensors.numpy.load_file(file), config)
