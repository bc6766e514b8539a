"""experiments/andrea120m.py: each variant validates, and they differ exactly as the seed says."""

import re

import jax
import pytest

from andrea_jax import runconfig
from andrea_jax.data import set_source
from andrea_jax.model import init_params


def _get_config(variant):
  from experiments import andrea120m
  return andrea120m.get_config(variant)


def _flat(d, prefix=""):
  out = {}
  for k, v in d.items():
    if isinstance(v, dict):
      out.update(_flat(v, f"{prefix}{k}."))
    else:
      out[prefix + k] = v
  return out


@pytest.fixture(scope="module")
def configs():
  return {v: _get_config(f"{v}:synthetic") for v in ("v1", "v2", "v3")}


def test_every_variant_validates_as_andrea_120m(configs):
  for name, c in configs.items():
    run = runconfig.build(c)
    m = run.model
    assert (m.num_layers, m.num_heads, m.d_model, m.d_mlp, m.max_len, m.head_dim) == (
        12, 12, 768, 3072, 1024, 64), name
    # GPT-2's vocabulary: GPT-2 small's 124M parameters (its tied embedding padded to 50,304
    # rows: 50,304 x 768 + 1024 x 768 + 12 blocks of 7,087,872 + the final LayerNorm's 1,536).
    assert m.dtype == "bfloat16" and m.vocab_size == 50_257, name
    assert sum(x.size for x in jax.tree.leaves(jax.eval_shape(
        init_params, m, jax.random.key(0)))) == 50_304 * 768 + 1024 * 768 + 12 * 7_087_872 + 1536
    assert c.train.num_steps == 200_000 and c.optim.peak_lr == 3e-4, name
    assert c.data.global_batch_size * c.data.seq_len == 524_288, name   # 0.5M tokens per step
    assert c.data.global_batch_size % (8 * c.optim.grad_accum_steps) == 0, name   # 8 GPUs
    if name != "v1":
      assert run.curriculum.starts.tolist()[:2] == [0, 20_000], name
    # The basin at ~112K can be measured after the run: that checkpoint is kept.
    assert 112_000 % c.train.keep_period == 0 and 112_000 % c.train.checkpoint_every == 0, name


def test_variants_differ_only_where_the_seed_says(configs):
  v1, v2, v3 = (_flat(configs[v].to_dict()) for v in ("v1", "v2", "v3"))
  # v1 lacks both of v2's warmups: the learning-rate ramp and the curriculum's warmup sub-simplex.
  differ = {k for k in set(v1) | set(v2) if v1.get(k) != v2.get(k)}
  assert {k for k in differ if not k.startswith("curriculum.geometries.")} == {"optim.warmup_steps"}
  assert (v1["optim.warmup_steps"], v2["optim.warmup_steps"]) == (0, 2000)
  s1, s2 = (runconfig.build(configs[v]).curriculum for v in ("v1", "v2"))
  assert s1.starts.tolist() == [0] and (s1.uppers == 1).all() and (s1.lowers == 0).all()
  assert s2.starts.tolist() == [0, 20_000] and int((s2.uppers[0] == 0).sum()) == 9
  added = set(v3) - set(v2)
  assert added and all(k.startswith("curriculum.geometries.v3_polish.") for k in added)
  assert set(v2) <= set(v3) and all(v2[k] == v3[k] for k in v2)
  assert v3["curriculum.geometries.v3_polish.start_step"] == 112_619
  polish = runconfig.build(configs["v3"]).curriculum
  assert polish.starts.tolist() == [0, 20_000, 112_619]


def test_an_unknown_variant_is_refused():
  with pytest.raises(ValueError, match=r"one of \('v1', 'v2', 'v3'\).*'v4'"):
    _get_config("v4")
  with pytest.raises(ValueError, match=r"one of \('hub', 'synthetic'\), got 'v2:disk'"):
    _get_config("v2:disk")


def test_the_real_run_reads_the_verified_datasets_and_names_the_sources_left_to_set(tmp_path):
  """By default the sources with a verified dataset read it (streamed); the run refuses to start
  while the others have no data, naming every one; pointed at data, it validates."""
  from andrea_jax.data.hub.andrea_sources import HUB_SOURCES
  c = _get_config("v3")
  assert c.data.corpus == "files"
  for source, verified in HUB_SOURCES.items():
    f = c.data.files[source.replace("-", "_")]
    assert (f.format, f.dataset, f.split, f.streaming) == ("hf", verified.spec.dataset,
                                                           verified.spec.split, True)
  unset = [s for s in runconfig.build(_get_config("v3:synthetic")).evaluated
           if s not in HUB_SOURCES]
  with pytest.raises(ValueError, match=re.escape(f"no data for the sources {unset}")):
    runconfig.build(c)
  (tmp_path / "text.txt").write_text("some text\n")
  for source in unset:
    set_source(c, source, "text", paths=str(tmp_path / "text.txt"))
  assert runconfig.build(c).sources[:3] == ("hermes3-general", "hermes3-creative",
                                            "hermes3-roleplay")
