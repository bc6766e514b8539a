"""The sampler and ``python -m andrea_jax.sample``: greedy text equals ``transformers``' greedy
``generate`` on the exported folder, nucleus draws follow the renormalised truncated distribution
(worked out here with numpy), and bad settings are refused with the numbers named."""

import json
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from andrea_jax import export
from andrea_jax import generate as gen
from andrea_jax import sample as sample_lib
from tests import hf_util
from tests.util import REPO

scipy_stats = pytest.importorskip("scipy.stats")

P_V = np.array([0.4, 0.25, 0.15, 0.1, 0.06, 0.04])   # a fixed distribution over 6 ids
LOGITS_V = np.log(P_V)


def _expected(logits_V, temperature=1.0, top_k=None, top_p=None) -> np.ndarray:
  """The distribution a draw follows, from the definitions (transformers' order): softmax of the
  tempered logits, the top k kept, renormalised, the smallest most probable prefix reaching top_p
  kept, renormalised."""
  z = logits_V / temperature
  p = np.exp(z - z.max())
  p /= p.sum()
  order = np.argsort(-p, kind="stable")
  keep = np.zeros(p.size, bool)
  keep[order[:top_k or p.size]] = True
  p = np.where(keep, p, 0.0) / p[keep].sum()
  if top_p is not None:
    mass_before = np.cumsum(p[order]) - p[order]
    nucleus = np.zeros(p.size, bool)
    nucleus[order[mass_before < top_p]] = True
    p = np.where(nucleus, p, 0.0) / p[nucleus].sum()
  return p


def test_nucleus_mask_by_hand():
  mask = gen.nucleus_mask(jnp.log(jnp.array([[0.5, 0.3, 0.2], [0.9, 0.05, 0.05]])), 0.7)
  assert mask.tolist() == [[True, True, False], [True, False, False]]
  # The most probable id always stays, however small top_p is.
  assert gen.nucleus_mask(jnp.log(jnp.array([[0.5, 0.5]])), 1e-9).tolist() == [[True, False]]


@pytest.mark.parametrize("temperature,top_k,top_p", [(1.0, None, 0.75), (1.0, 4, 0.6),
                                                     (2.0, None, 0.7), (0.7, 5, 0.9)])
def test_nucleus_draws_follow_the_renormalised_truncated_distribution(temperature, top_k, top_p):
  n = 20_000
  logits_NxV = jnp.tile(jnp.asarray(LOGITS_V, jnp.float32)[None], (n, 1))
  ids = np.asarray(gen.sample_logits(logits_NxV, jax.random.key(3), temperature=temperature,
                                     top_k=top_k, top_p=top_p))
  want = _expected(LOGITS_V, temperature, top_k, top_p)
  counts = np.bincount(ids, minlength=P_V.size)
  assert counts[want == 0].sum() == 0, (counts, want)   # nothing outside the nucleus
  kept = want > 0
  assert kept.sum() >= 2
  _, p_value = scipy_stats.chisquare(counts[kept], n * want[kept])
  assert p_value > 1e-3, (counts, n * want)


def test_top_p_one_is_the_sampler_without_it_bit_for_bit_and_tiny_top_p_is_greedy():
  cfg = hf_util.CFG
  params = hf_util.random_params()
  prompt = np.array([[256, 72, 105], [256, 65, 66]], np.int32)
  run = jax.jit(gen.generate, static_argnames=("max_new_tokens", "top_k", "greedy", "top_p"))
  key = jax.random.key(5)
  off = run(params, cfg, prompt, key, max_new_tokens=12, temperature=0.9, top_k=50)
  one = run(params, cfg, prompt, key, max_new_tokens=12, temperature=0.9, top_k=50, top_p=1.0)
  np.testing.assert_array_equal(off, one)
  greedy = run(params, cfg, prompt, key, max_new_tokens=12, greedy=True)
  tiny = run(params, cfg, prompt, key, max_new_tokens=12, temperature=0.9, top_p=1e-6)
  np.testing.assert_array_equal(tiny, greedy)
  top1 = run(params, cfg, prompt, key, max_new_tokens=12, temperature=0.9, top_k=1)
  np.testing.assert_array_equal(top1, greedy)


@pytest.mark.parametrize("bad, error, message", [
    (0.0, ValueError, "top_p must be in (0, 1], got 0.0"),
    (-0.5, ValueError, "top_p must be in (0, 1], got -0.5"),
    (1.5, ValueError, "top_p must be in (0, 1], got 1.5"),
    (float("nan"), ValueError, "top_p must be finite, got nan"),
    # A value of the wrong type is a TypeError (andrea_jax.checks).
    ("0.9", TypeError, "top_p must be a number or None, got '0.9'"),
    (True, TypeError, "top_p must be a number or None, got True"),
])
def test_a_top_p_outside_zero_one_is_refused(bad, error, message):
  with pytest.raises(error) as e:
    gen.sample_logits(jnp.zeros((1, 4)), jax.random.key(0), top_p=bad)
  assert str(e.value) == message


def test_greedy_text_equals_transformers_generate_on_the_exported_folder(tmp_path):
  """llm.c's ``spin`` as an assertion: the exported folder, ``transformers``' greedy
  ``generate`` (which stops at the folder's end-of-document id), our greedy sampler."""
  torch = pytest.importorskip("torch")
  transformers = pytest.importorskip("transformers")
  model = hf_util.model(hf_util.random_params(std=0.5, seed=2))
  export.write_folder(model, str(tmp_path / "hf"))
  hf = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "hf"),
                                                         dtype=torch.float32).eval()
  for prompt in ("The ", "déjà vu: ", ""):
    ours = sample_lib.sample(model, prompt, greedy=True, max_new_tokens=40)
    ids = torch.tensor([ours["prompt_ids"]])
    with torch.no_grad():
      theirs = hf.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                           max_new_tokens=40)[0, ids.shape[1]:].tolist()
    if theirs and theirs[-1] == 256:   # transformers keeps the end-of-document id it stopped at
      theirs = theirs[:-1]
      assert ours["samples"][0]["stopped_at_eod"]
    assert ours["samples"][0]["ids"] == theirs, prompt


def test_samples_depend_on_the_seed_only_and_stop_at_the_end_of_a_document():
  model = hf_util.model(hf_util.random_params(std=0.5, seed=4))
  a = sample_lib.sample(model, "The ", num_samples=4, max_new_tokens=30, temperature=1.0, seed=1)
  b = sample_lib.sample(model, "The ", num_samples=4, max_new_tokens=30, temperature=1.0, seed=1)
  c = sample_lib.sample(model, "The ", num_samples=4, max_new_tokens=30, temperature=1.0, seed=2)
  assert a == b and a != c
  assert a["prompt_ids"][0] == 256   # after the end-of-document id, as training documents
  # A model whose end-of-document logit dominates stops at once.
  params = hf_util.random_params(std=0.5, seed=4)
  params["ln_f"]["bias"] = 0.0 * params["ln_f"]["bias"] + 3.0
  params["ln_f"]["scale"] = 0.0 * params["ln_f"]["scale"]
  params["wte"]["embedding"] = params["wte"]["embedding"].at[256].set(1.0)
  stopped = sample_lib.sample(hf_util.model(params), "The ", num_samples=2, max_new_tokens=8)
  assert all(s["stopped_at_eod"] and s["ids"] == [] for s in stopped["samples"])


@pytest.mark.parametrize("kwargs,message", [
    (dict(max_new_tokens=60), "the prompt is 5 tokens (with the end-of-document id) and "
     "--max_new_tokens 60 asks for 65 positions, more than the model's context of 64: lower "
     "--max_new_tokens to 59"),
    (dict(temperature=0.0), "--temperature must be > 0, got 0.0 (--greedy takes the most "
     "probable token)"),
    (dict(temperature=-1.0), "--temperature must be > 0, got -1.0 (--greedy takes the most "
     "probable token)"),
    (dict(top_p=1.2), "top_p must be in (0, 1], got 1.2"),
    (dict(top_p=0.0), "top_p must be in (0, 1], got 0.0"),
    (dict(top_k=300), "--top_k must be <= 257, got 300 (the vocabulary)"),
    (dict(top_k=0), "--top_k must be >= 1, got 0 (the vocabulary)"),
    (dict(num_samples=0), "--num_samples must be >= 1, got 0"),
    (dict(max_new_tokens=0), "--max_new_tokens must be >= 1, got 0"),
])
def test_bad_settings_are_refused_naming_the_numbers(kwargs, message):
  with pytest.raises(ValueError) as e:
    sample_lib.sample(hf_util.model(), "The ", **kwargs)
  assert message in str(e.value)


def test_a_prompt_longer_than_the_context_is_refused():
  with pytest.raises(ValueError, match="the prompt is 65 tokens .* the model's context holds 64"):
    sample_lib.sample(hf_util.model(), "x" * 64)


def test_chat_wraps_the_prompt_in_the_template_and_needs_one():
  model = hf_util.model(template="chatml")
  ids = sample_lib.prompt_ids(model, "Hi", chat=True)
  assert bytes(ids[1:].tolist()).decode() == (
      "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
  with pytest.raises(ValueError, match="was not trained on conversations"):
    sample_lib.prompt_ids(hf_util.model(), "Hi", chat=True)


@pytest.mark.slow
def test_the_command_line_on_an_exported_folder(tmp_path):
  export.write_folder(hf_util.model(hf_util.random_params(std=0.5), template="chatml"),
                      str(tmp_path / "hf"))
  (tmp_path / "p.txt").write_text("Once")
  cmd = [sys.executable, "-m", "andrea_jax.sample", "--hf", str(tmp_path / "hf")]
  env = dict(__import__("os").environ, **hf_util.OFFLINE)
  run = lambda *a: subprocess.run(cmd + list(a), cwd=REPO, capture_output=True, text=True,
                                  env=env, timeout=300)
  out = run("--prompt_file", str(tmp_path / "p.txt"), "--num_samples", "2", "--top_p", "0.9",
            "--max_new_tokens", "10", "--seed", "3", "--json")
  assert out.returncode == 0, out.stderr
  result = json.loads(out.stdout)
  assert result["settings"]["top_p"] == 0.9 and result["step"] == 7
  assert len(result["samples"]) == 2 and result["prompt_ids"] == [256, 79, 110, 99, 101]
  out = run("--chat", "--prompt", "Hi", "--greedy", "--max_new_tokens", "5")
  assert out.returncode == 0, out.stderr
  assert out.stdout.count(sample_lib.SEPARATOR) == 1 and out.stdout.startswith("Hi")
  out = run("--prompt", "Hi", "--temperature", "0")
  assert out.returncode == 1
  assert out.stderr.startswith("error: --temperature must be > 0, got 0.0 (--greedy takes the most "
                               "probable token)")
  out = run("--prompt", "Hi", "--step", "3")
  assert out.returncode == 1 and "--step 3 picks a checkpoint of a run" in out.stderr
