"""A run that starts from pretrained weights (``init.from_hf``, ``init.from_run``).

Its loss at step 0 is ``transformers``' loss of the same weights on the same ids; it starts with a
fresh optimizer at step 0; restarted, it resumes from its own checkpoint and never reads the
source again; every mismatch between the source and the run is refused, named; another run's
workdir it starts from is left as it was."""

import hashlib
import json
import os
import pathlib

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
import safetensors.numpy

from andrea_jax import checkpoint as ckpt_lib
from andrea_jax import curriculum
from andrea_jax import data as data_lib
from andrea_jax import hf_files
from andrea_jax import model as m
from andrea_jax import pretrained
from andrea_jax import resume as resume_lib
from andrea_jax import runconfig
from andrea_jax import train
from tests import hf_util
from tests.util import small_run_config

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
# The tests' few-step runs end before the curriculum's later geometries start.
pytestmark = pytest.mark.filterwarnings("ignore:curriculum geometries")

BYTES = data_lib.load_tokenizer("bytes")
CFG = hf_util.CFG   # the run's model: small_run_config's


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> str:
  """A random GPT-2 of the run's shape as transformers saves it (no tokenizer)."""
  return hf_util.hf_gpt2_folder(tmp_path_factory.mktemp("gpt2") / "hf")


def _copy(src, dst, *, drop=(), add=None, config=None, tokenizer=None) -> str:
  """``src`` with tensors dropped, added or replaced, config.json fields changed, a tokenizer."""
  os.makedirs(dst)
  tensors = safetensors.numpy.load_file(os.path.join(src, "model.safetensors"))
  tensors = {k: v for k, v in tensors.items() if k not in drop}
  tensors.update(add or {})
  safetensors.numpy.save_file(tensors, os.path.join(dst, "model.safetensors"),
                              metadata={"format": "pt"})
  c = json.loads(pathlib.Path(src, "config.json").read_text())
  c.update(config or {})
  pathlib.Path(dst, "config.json").write_text(json.dumps(c))
  if tokenizer is not None:
    pathlib.Path(dst, "tokenizer.json").write_text(tokenizer)
  return str(dst)


def _hf_loss(folder, ids_BxT) -> float:
  hf = transformers.GPT2LMHeadModel.from_pretrained(folder, dtype=torch.float32).eval()
  ids = torch.from_numpy(np.asarray(ids_BxT, np.int64))
  with torch.no_grad():
    return float(hf(ids, labels=ids).loss)


def test_the_loaded_weights_give_transformers_loss_on_the_same_ids(folder):
  source = pretrained.from_hf(folder, CFG, BYTES)
  ids_BxT = np.random.default_rng(0).integers(0, 257, size=(3, CFG.max_len))
  logits = m.Transformer(CFG).apply({"params": source.params}, ids_BxT)
  logp = jax.nn.log_softmax(logits[:, :-1].astype(jnp.float32), axis=-1)
  ours = -float(jnp.mean(jnp.take_along_axis(logp, ids_BxT[:, 1:, None], axis=-1)))
  assert ours == pytest.approx(_hf_loss(folder, ids_BxT), abs=1e-5)
  assert source.record["sha256"] == hashlib.sha256(
      pathlib.Path(folder, "model.safetensors").read_bytes()).hexdigest()
  assert source.record["step"] is None and source.notes == ()
  assert source.params["wte"]["embedding"].shape == (CFG.padded_vocab_size, CFG.d_model)


def test_a_shorter_context_keeps_the_first_positions(folder):
  source = pretrained.from_hf(folder, dataclasses_replace(CFG, max_len=16), BYTES)
  full = safetensors.numpy.load_file(os.path.join(folder, "model.safetensors"))
  np.testing.assert_array_equal(source.params["wpe"]["embedding"],
                                full["transformer.wpe.weight"][:16])
  assert source.notes == ("init: model.max_len = 16 keeps the first 16 of the source's 64 position "
                          "embeddings",)


def dataclasses_replace(cfg, **kw):
  import dataclasses
  return dataclasses.replace(cfg, **kw)


def _refused(spec, mcfg=CFG, tokenizer=BYTES) -> str:
  with pytest.raises(pretrained.InitError) as e:
    pretrained.from_hf(spec, mcfg, tokenizer)
  return str(e.value)


def test_every_architecture_mismatch_is_named_with_the_flags_that_fit(folder, tmp_path):
  other = hf_util.hf_gpt2_folder(tmp_path / "other", vocab_size=300, n_layer=3, n_head=4,
                                 n_positions=32)
  msg = _refused(other)
  for part in ("model.num_layers = 2 but init.from_hf", "has 3 (n_layer)",
               "model.num_heads = 2 but", "has 4 (n_head)",
               "the run's vocabulary has 257 ids (data.tokenizer = 'bytes' has 257) but",
               "has 300 (vocab_size): set data.tokenizer to the source's tokenizer",
               "model.max_len = 64 exceeds the 32 positions of init.from_hf",
               "--config.model.num_layers=3 --config.model.num_heads=4 --config.model.max_len=32"):
    assert part in msg, (part, msg)


@pytest.mark.parametrize("change,expected", [
    (dict(drop=("transformer.h.1.mlp.c_fc.bias",)),
     "missing tensor transformer.h.1.mlp.c_fc.bias (expected shape (128,))"),
    (dict(add={"transformer.h.2.ln_1.weight": np.ones(32, np.float32)}),
     "unexpected tensor transformer.h.2.ln_1.weight (32,)"),
    (dict(add={"transformer.h.0.attn.c_proj.weight": np.ones((32, 16), np.float32)}),
     "tensor transformer.h.0.attn.c_proj.weight has shape (32, 16), expected (32, 32)"),
    (dict(config={"activation_function": "relu"}),
     "activation_function = 'relu'; this model computes 'gelu_new'"),
])
def test_a_missing_extra_or_misshapen_tensor_is_named(folder, tmp_path, change, expected):
  assert expected in _refused(_copy(folder, tmp_path / "bad", **change))


def test_missing_files_and_an_offline_hub_model_are_named(folder, tmp_path):
  assert "not a directory" in _refused(str(tmp_path / "nowhere"))
  bad = _copy(folder, tmp_path / "bad")
  os.remove(os.path.join(bad, "model.safetensors"))
  assert f"{bad}/model.safetensors is missing" in _refused(bad)
  msg = _refused("hf:nobody/no-such-model")
  assert "offline mode is on" in msg and "init.from_hf = DIR" in msg


def _byte_tokenizer_json(swap=None) -> str:
  """The byte tokenizer's tokenizer.json, two bytes' ids swapped when ``swap`` names them."""
  text = json.loads(hf_files.byte_level_tokenizer_json())
  if swap:
    vocab = text["model"]["vocab"]
    a, b = swap
    vocab[a], vocab[b] = vocab[b], vocab[a]
  return json.dumps(text)


def test_a_tokenizer_beside_the_weights_must_encode_as_the_runs(folder, tmp_path):
  same = _copy(folder, tmp_path / "same", tokenizer=_byte_tokenizer_json())
  pretrained.from_hf(same, CFG, BYTES)    # the exported byte tokenizer: accepted
  other = _copy(folder, tmp_path / "other", tokenizer=_byte_tokenizer_json(swap=("e", "o")))
  msg = _refused(other)
  assert "tokenizer.json) and the run's data.tokenizer = 'bytes' encode the same text " \
         "differently (" in msg and "Set data.tokenizer to the source's tokenizer" in msg


def test_the_init_section_is_validated():
  spec = lambda **kw: pretrained.init_spec(ml_collections.ConfigDict(
      {"from_hf": "", "from_run": "", **kw}))
  assert spec() is None and pretrained.init_spec(None) is None
  assert spec(from_run="runs/a:500") == pretrained.InitSpec(from_run="runs/a", run_step=500)
  assert spec(from_run="runs/a") == pretrained.InitSpec(from_run="runs/a")
  assert spec(from_hf="hf:gpt2").source == "init.from_hf = 'hf:gpt2'"
  with pytest.raises(ValueError, match="cannot specify both init.from_hf = 'a' and "
                                       "init.from_run = 'b'"):
    spec(from_hf="a", from_run="b")
  with pytest.raises(ValueError, match="the step after ':' must be >= 0"):
    spec(from_run="runs/a:-3")
  with pytest.raises(TypeError, match=r"init.from_hf must be a string, got 3 \(a path, or '' for "
                                      r"none\)"):
    spec(from_hf=3)
  # And runconfig.build makes it, the run's one new field.
  assert runconfig.build(small_run_config(init__from_run="runs/a:7")).init.run_step == 7
  with pytest.raises(ValueError, match="cannot specify both"):
    runconfig.build(small_run_config(init__from_run="b", init__from_hf="a"))


def test_the_run_starts_with_the_sources_parameters_and_a_fresh_optimizer(folder, tmp_path):
  run = runconfig.build(small_run_config(init__from_hf=folder))
  state = jax.jit(lambda: train.init_state(run, train.run_keys(0)))()
  # A state whose moments are not zero: start_from must build new ones for the new parameters.
  state = state.replace(opt_state=jax.tree.map(lambda x: x + 1, state.opt_state))
  run2, source = resume_lib.init_source(run, str(tmp_path / "checkpoints"))
  started = resume_lib.start_from(source, state, run2)
  jax.tree.map(np.testing.assert_array_equal, started.params, source.params)
  assert all(float(jnp.abs(x).max()) == 0 for x in jax.tree.leaves(started.opt_state))
  assert int(started.step) == 0
  assert run2.record["init"]["sha256"] == source.record["sha256"]
  assert run2.record["init"]["from_hf"] == folder and "sha256" not in run.record["init"]


def _snapshot(root) -> dict:
  return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns,
                                     hashlib.sha256(p.read_bytes()).hexdigest())
          for p in sorted(pathlib.Path(root).rglob("*")) if p.is_file()}


def _hf_loss_of_batch(folder, batch) -> float:
  """The mean loss ``transformers`` gives the counted tokens of a packed batch: each document of
  each row alone (as the document mask and the restarting positions make ours see it)."""
  hf = transformers.GPT2LMHeadModel.from_pretrained(folder, dtype=torch.float32).eval()
  total, count = 0.0, 0
  for b in range(len(batch["inputs"])):
    seg = batch["segment_ids"][b]
    for s in np.unique(seg[seg > 0]):
      at = seg == s
      with torch.no_grad():
        logits = hf(torch.from_numpy(batch["inputs"][b][at][None].astype(np.int64))).logits[0]
      logp = torch.log_softmax(logits.double(), -1)
      targets = torch.from_numpy(batch["targets"][b][at].astype(np.int64))
      total -= float(logp[torch.arange(len(targets)), targets].sum())
      count += int(at.sum())
  return total / count


def _step0_batch(c):
  run = runconfig.build(c)
  data = data_lib.open_training_data(run.data, required=run.evaluated, progress=False)
  state = jax.jit(lambda: train.init_state(run, train.run_keys(c.seed)))()
  w = np.asarray(curriculum.weights_at(jax.tree.map(np.asarray, curriculum.schedule(
      state.curriculum)), 0), np.float64)
  sampler = data_lib.MixtureSampler(data, seq_len=c.data.seq_len,
                                    global_batch_size=c.data.global_batch_size, seed=c.seed)
  return run, sampler.batch(0, w)


@pytest.mark.slow
def test_a_fine_tune_starts_at_transformers_loss_resumes_from_itself_and_reads_runs_only(
    folder, tmp_path, capsys, data_cache):
  """From an HF folder: the logged step-0 loss is transformers' on the same batch, the learning
  rate the warmup's first; restarted without the folder, the run resumes from its checkpoint.
  From that run's workdir: its checkpoint's parameters, the workdir untouched."""
  source = _copy(folder, tmp_path / "source")
  c = lambda stop, **kw: small_run_config(num_steps=4, train__stop_step=stop,
                                          train__checkpoint_every=2, train__log_every=1,
                                          optim__warmup_steps=2, **kw)
  first = train.train_and_evaluate(c(2, init__from_hf=source), str(tmp_path / "a"))
  assert first["start_step"] == 0
  assert f"init: params from init.from_hf = '{source}' (sha256 " in capsys.readouterr().out
  records = [json.loads(line) for line in (tmp_path / "a" / "metrics.jsonl").open()]
  step0 = next(r for r in records if r["step"] == 0 and "loss" in r)
  run, batch = _step0_batch(c(2, init__from_hf=source))
  assert step0["loss"] == pytest.approx(_hf_loss_of_batch(source, batch), rel=1e-5)
  assert step0["lr"] == pytest.approx(float(run.step.schedule(0)), abs=1e-12)
  sha = hashlib.sha256(pathlib.Path(source, "model.safetensors").read_bytes()).hexdigest()
  recorded = json.loads((tmp_path / "a" / "config.json").read_text())["init"]
  assert recorded == {"from_hf": source, "from_run": "", "sha256": sha, "step": None,
                      "path": os.path.join(source, "model.safetensors")}

  # Restarted with the source gone: the run's own checkpoint wins, the source is never read.
  os.rename(source, str(tmp_path / "gone"))
  again = train.train_and_evaluate(c(4, init__from_hf=source), str(tmp_path / "a"))
  assert again["start_step"] == 2 and again["end_step"] == 4
  assert "is not read again (the run's own checkpoint wins)" in capsys.readouterr().out
  assert json.loads((tmp_path / "a" / "config.json").read_text())["init"] == recorded
  saved = ckpt_lib.load_checkpoint(str(tmp_path / "a"), 2)

  # Another run starts from run a's step 2; run a's workdir is left as it was.
  before = _snapshot(tmp_path / "a")
  b = small_run_config(num_steps=1, optim__warmup_steps=1, init__from_run=f"{tmp_path / 'a'}:2")
  run_b, source_b = resume_lib.init_source(runconfig.build(b), str(tmp_path / "b"))
  v = CFG.vocab_size
  for tree in (source_b.params, saved.params):
    tree["wte"] = {"embedding": np.asarray(tree["wte"]["embedding"])[:v]}
  jax.tree.map(np.testing.assert_array_equal, source_b.params, saved.params)
  assert run_b.record["init"]["step"] == 2
  assert run_b.record["init"]["sha256"] == pretrained.params_sha256(
      ckpt_lib.load_checkpoint(str(tmp_path / "a"), 2).params)
  assert train.train_and_evaluate(b, str(tmp_path / "b"))["end_step"] == 1
  assert _snapshot(tmp_path / "a") == before


@pytest.mark.slow
def test_a_run_that_does_not_fit_is_refused_by_the_command_line_before_it_trains(folder,
                                                                                   tmp_path):
  """One ``error:`` line naming the mismatch (the run's data and model are never built)."""
  import subprocess
  import sys
  from tests.util import REPO
  out = subprocess.run(
      [sys.executable, "-m", "andrea_jax.main", f"--config={REPO / 'experiments' / 'tiny.py'}",
       f"--workdir={tmp_path / 'run'}", f"--config.init.from_hf={folder}"],
      cwd=REPO, capture_output=True, text=True, timeout=300,
      env=dict(os.environ, **hf_util.OFFLINE))
  assert out.returncode == 1, out.stdout + out.stderr
  assert out.stderr.startswith(f"error: the weights of init.from_hf = '{folder}' do not fit this "
                               "run: model.num_layers = 4 but"), out.stderr
  assert "Traceback" not in out.stderr
  assert not (tmp_path / "run" / "checkpoints").exists() or not os.listdir(
      tmp_path / "run" / "checkpoints")
