"""GPT-2 weight conversion against Hugging Face transformers (logits agree to 1e-5 both ways)."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from andrea_jax import convert
from andrea_jax import model as m

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

# vocab 100 pads to 128: exercises the padding on import and the cut on export.
CFG = m.ModelConfig(vocab_size=100, max_len=16, num_layers=2, num_heads=4, d_model=32, d_mlp=64)


def _hf_model(seed=0):
  """A random float32 GPT2LMHeadModel; every tensor randomised (biases and LayerNorms too), so a
  swapped or transposed tensor cannot go unnoticed."""
  torch.manual_seed(seed)
  hf_cfg = transformers.GPT2Config(
      vocab_size=100, n_positions=16, n_embd=32, n_layer=2, n_head=4, n_inner=64,
      activation_function="gelu_new", resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
      bos_token_id=99, eos_token_id=99)
  model = transformers.GPT2LMHeadModel(hf_cfg).float().eval()
  with torch.no_grad():
    for name, p in model.named_parameters():
      if name.endswith(("ln_1.weight", "ln_2.weight", "ln_f.weight")):
        p.copy_(1.0 + 0.2 * torch.randn_like(p))
      else:
        p.copy_(0.2 * torch.randn_like(p))
  return model


def _hf_logits(model, tokens):
  with torch.no_grad():
    return model(torch.from_numpy(np.asarray(tokens, np.int64))).logits.numpy()


@jax.jit
def _our_logits(params, tokens):
  return m.Transformer(CFG).apply({"params": params}, tokens)


TOKENS = np.random.default_rng(0).integers(0, 100, size=(2, 16))


def test_hf_to_ours_logits_agree():
  hf = _hf_model()
  params = convert.from_hf_state_dict(hf.state_dict(), CFG)
  assert params["wte"]["embedding"].shape == (128, 32)
  assert np.all(np.asarray(params["wte"]["embedding"][100:]) == 0.0)
  np.testing.assert_allclose(_our_logits(params, TOKENS), _hf_logits(hf, TOKENS), atol=1e-5)


def test_ours_to_hf_via_safetensors_logits_agree(tmp_path):
  # Every tensor random (LayerNorm scales and biases too) so each tensor's mapping is checked.
  rng = np.random.default_rng(1)
  shapes = jax.eval_shape(m.init_params, CFG, jax.random.key(0))
  params = jax.tree_util.tree_map(
      lambda s: jnp.asarray(0.2 * rng.normal(size=s.shape), jnp.float32), shapes)

  file = convert.save_safetensors(params, CFG, tmp_path / "andrea")
  assert file.endswith("model.safetensors")
  assert json.loads((tmp_path / "andrea" / "config.json").read_text())["n_inner"] == 64
  hf = transformers.GPT2LMHeadModel.from_pretrained(str(tmp_path / "andrea")).eval()
  assert next(hf.parameters()).dtype == torch.float32
  np.testing.assert_allclose(_hf_logits(hf, TOKENS), _our_logits(params, TOKENS), atol=1e-5)

  # And back: the padded rows come back as zeros, everything else exactly.
  loaded = convert.load_safetensors(tmp_path / "andrea", CFG)
  np.testing.assert_array_equal(loaded["wte"]["embedding"][:100], params["wte"]["embedding"][:100])
  np.testing.assert_array_equal(loaded["wte"]["embedding"][100:], 0.0)
  loaded["wte"]["embedding"] = params["wte"]["embedding"]
  jax.tree_util.tree_map(np.testing.assert_array_equal, loaded, params)


def test_state_dict_round_trip_and_hf_config():
  hf = _hf_model(seed=1)
  sd = {k: v.numpy() for k, v in hf.state_dict().items()}
  back = convert.to_hf_state_dict(convert.from_hf_state_dict(sd, CFG), CFG)
  assert sorted(back) == sorted(sd)
  for k in sd:
    np.testing.assert_array_equal(back[k], sd[k], err_msg=k)
  hf_cfg = transformers.GPT2Config(**convert.hf_gpt2_config(CFG))
  assert (hf_cfg.n_embd, hf_cfg.n_layer, hf_cfg.n_head, hf_cfg.n_inner, hf_cfg.n_positions,
          hf_cfg.vocab_size, hf_cfg.activation_function) == (32, 2, 4, 64, 16, 100, "gelu_new")
  assert (hf_cfg.bos_token_id, hf_cfg.eos_token_id) == (99, 99)   # the byte tokenizer's place
  # A BPE trained here has its end of document at 0: the export must say so.
  assert convert.hf_gpt2_config(CFG, eod_id=0)["eos_token_id"] == 0
  with pytest.raises(ValueError, match=r"hf_gpt2_config: eod_id must be <= 99, got 100 \(a token "
                                       r"id below the model's vocab_size = 100\)"):
    convert.hf_gpt2_config(CFG, eod_id=100)
  with pytest.raises(TypeError, match=r"hf_gpt2_config: eod_id must be an integer, got 9.0"):
    convert.hf_gpt2_config(CFG, eod_id=9.0)


def test_save_safetensors_writes_the_tokenizers_end_of_document(tmp_path):
  params = m.init_params(CFG, jax.random.key(0))
  convert.save_safetensors(params, CFG, tmp_path / "d", eod_id=0)
  written = json.loads((tmp_path / "d" / "config.json").read_text())
  assert written["bos_token_id"] == written["eos_token_id"] == 0


def test_hub_layout_without_prefix_is_accepted():
  sd = {k: v.numpy() for k, v in _hf_model().state_dict().items()}
  hub = {k.removeprefix("transformer."): v for k, v in sd.items() if k != "lm_head.weight"}
  hub["h.0.attn.bias"] = np.tril(np.ones((1, 1, 16, 16)))  # old transformers' causal-mask buffer
  a, b = convert.from_hf_state_dict(hub, CFG), convert.from_hf_state_dict(sd, CFG)
  jax.tree_util.tree_map(np.testing.assert_array_equal, a, b)


def test_errors_name_the_tensor(tmp_path):
  sd = {k: v.numpy() for k, v in _hf_model().state_dict().items()}
  with pytest.raises(ValueError, match=r"transformer\.h\.1\.mlp\.c_fc\.bias"):
    convert.from_hf_state_dict({k: v for k, v in sd.items() if "h.1.mlp.c_fc.bias" not in k}, CFG)
  with pytest.raises(ValueError, match=r"transformer\.h\.0\.attn\.c_attn\.weight.*\(96, 32\)"):
    convert.from_hf_state_dict(
        {**sd, "transformer.h.0.attn.c_attn.weight": sd["transformer.h.0.attn.c_attn.weight"].T},
        CFG)
  with pytest.raises(ValueError, match=r"transformer\.h\.2\.ln_1\.weight"):
    convert.from_hf_state_dict({**sd, "transformer.h.2.ln_1.weight": np.ones(32)}, CFG)
  with pytest.raises(ValueError, match="lm_head.weight"):
    convert.from_hf_state_dict({**sd, "lm_head.weight": sd["lm_head.weight"] + 1.0}, CFG)
  with pytest.raises(ValueError, match=r"h_0/ln_2/scale"):
    params = convert.from_hf_state_dict(sd, CFG)
    del params["h_0"]["ln_2"]["scale"]
    convert.to_hf_state_dict(params, CFG)
  with pytest.raises(ValueError, match=r"params has parameter\(s\) the config does not name: "
                                      r"\['h_1/"):
    one_layer = m.ModelConfig(**{**CFG.to_dict(), "num_layers": 1})
    convert.to_hf_state_dict(convert.from_hf_state_dict(sd, CFG), one_layer)
  convert.save_safetensors(convert.from_hf_state_dict(sd, CFG), CFG, tmp_path / "w.safetensors")
  with pytest.raises(ValueError, match="n_head=4.*2"):
    convert.load_safetensors(tmp_path / "w.safetensors",
                             m.ModelConfig(**{**CFG.to_dict(), "num_heads": 2}))


def test_an_attention_variant_this_model_does_not_compute_is_refused(tmp_path):
  params = m.init_params(CFG, jax.random.key(0))
  convert.save_safetensors(params, CFG, tmp_path / "d")
  hf_config = json.loads((tmp_path / "d" / "config.json").read_text())
  for key, value in (("scale_attn_by_inverse_layer_idx", True), ("scale_attn_weights", False)):
    (tmp_path / "d" / "config.json").write_text(json.dumps({**hf_config, key: value}))
    with pytest.raises(ValueError, match=rf"config.json: {key}={value!r}; this model"):
      convert.load_safetensors(tmp_path / "d", CFG)
