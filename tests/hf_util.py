"""Helpers of the tests around a run's weights and Hugging Face folders: tiny random models made
here (never downloaded), as our parameter trees or as folders ``transformers`` saved."""

import os

import jax
import jax.numpy as jnp
import numpy as np

from andrea_jax import data as data_lib
from andrea_jax import model as m
from andrea_jax import trained

# The offline environment every test of this kind runs in (and hands to its subprocesses).
OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
os.environ.update(OFFLINE)

# Byte vocabulary, 64 positions, 2 layers of width 32: the model of the tests' runs
# (tests.util.small_run_config).
CFG = m.ModelConfig(vocab_size=257, max_len=64, num_layers=2, num_heads=2, d_model=32,
                    d_mlp=128)


def random_params(cfg: m.ModelConfig = CFG, std: float = 0.3, seed: int = 0):
  """GPT-2-shaped parameters, every tensor random (LayerNorms and biases too, so that a swapped or
  transposed tensor shows), larger than the training init so that predictions vary; the padded
  embedding rows are zero, as a converted model's are."""
  rng = np.random.default_rng(seed)

  def leaf(path, s):
    name = path[-1].key
    if name == "scale":
      return jnp.asarray(1.0 + 0.2 * rng.normal(size=s.shape), jnp.float32)
    value = std * rng.normal(size=s.shape)
    if path[0].key == "wte":
      value[cfg.vocab_size:] = 0.0
    return jnp.asarray(value, jnp.float32)

  return jax.tree_util.tree_map_with_path(leaf, jax.eval_shape(m.init_params, cfg,
                                                               jax.random.key(0)))


def model(params=None, cfg: m.ModelConfig = CFG, tokenizer="bytes", template: str | None = None,
          origin: str = "/runs/test", step: int = 7) -> trained.TrainedModel:
  """A :class:`TrainedModel` of ``params`` (default: :func:`random_params`)."""
  tok = data_lib.load_tokenizer(tokenizer) if isinstance(tokenizer, str) else tokenizer
  return trained.TrainedModel(params if params is not None else random_params(cfg), cfg, tok,
                              origin, step, template, {"sources": ["a", "b"]})


def hf_gpt2_folder(path, *, vocab_size=257, n_positions=64, n_layer=2, n_embd=32, n_head=2,
                   n_inner=128, eod_id=None, seed=0, std=0.2) -> str:
  """A random float32 ``GPT2LMHeadModel`` saved by ``transformers`` (``save_pretrained``) at
  ``path``; every tensor randomised."""
  import torch
  import transformers
  torch.manual_seed(seed)
  eod = vocab_size - 1 if eod_id is None else eod_id
  config = transformers.GPT2Config(
      vocab_size=vocab_size, n_positions=n_positions, n_embd=n_embd, n_layer=n_layer,
      n_head=n_head, n_inner=n_inner, activation_function="gelu_new", resid_pdrop=0.0,
      embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=eod, eos_token_id=eod)
  hf = transformers.GPT2LMHeadModel(config).float().eval()
  with torch.no_grad():
    for name, p in hf.named_parameters():
      if name.endswith(("ln_1.weight", "ln_2.weight", "ln_f.weight")):
        p.copy_(1.0 + 0.2 * torch.randn_like(p))
      else:
        p.copy_(std * torch.randn_like(p))
  hf.save_pretrained(str(path))
  return str(path)


def hf_logits(folder: str, ids_BxT) -> np.ndarray:
  """``AutoModelForCausalLM``'s float32 logits of ``ids``."""
  import torch
  import transformers
  hf = transformers.AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
  with torch.no_grad():
    return hf(torch.from_numpy(np.asarray(ids_BxT, np.int64))).logits.numpy()
