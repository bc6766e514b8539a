"""``python -m andrea_jax.export``: the folder stands alone for ``transformers``. Its logits at the
full context agree with ours to 1e-4 (float32), ``AutoTokenizer`` encodes as the run's tokenizer
did (bytes, a BPE, a BPE with chat markers), the chat template renders as the run rendered it,
``pipeline("text-generation")`` runs, every place that names the end-of-document id agrees, and
the folder is written whole or not at all."""

import io
import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from andrea_jax import convert
from andrea_jax import data as data_lib
from andrea_jax import export
from andrea_jax import hf_files
from andrea_jax import model as m
from andrea_jax import trained
from andrea_jax.data.hub.templates import render_chat
from andrea_jax.data.hub.template_files import load_chat_template
from tests import hf_util
from tests.util import REPO, small_run_config

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
# The tests' two-step runs end before the curriculum's later geometries start.
pytestmark = pytest.mark.filterwarnings("ignore:curriculum geometries")

# ASCII, accents, CJK, emoji (one with a joiner), tabs, blank lines, spaces at either end, code.
PROBES = ["Hello, world!", "  leading and trailing  ", "café naïve déjà-vu Ærø", "漢字とかな 한국어",
          "😀🚀 👩\u200d👧", "a\tb\t\tc", "para one\n\npara two\n\n\n", "def f(x):\n    return x**2",
          "", " ", "\n"]
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"},
            {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "Bye"}]


def _bpe(tmp_path, markers=()):
  from andrea_jax.data.corpora.synthetic import builtin_documents
  from andrea_jax.data.hub.templates import add_chat_tokens
  path = tmp_path / "bpe.json"
  tok = data_lib.train_bpe(builtin_documents("chat", 0.02) + PROBES * 3, 400, path)
  return add_chat_tokens(path, markers, tmp_path / "bpe_chat.json") if markers else tok


def test_logits_at_the_full_context_agree_with_transformers(tmp_path):
  # vocab 450 pads to 512: the export cuts the padding, the folder's config says 450.
  cfg = m.ModelConfig(vocab_size=450, max_len=96, num_layers=2, num_heads=4, d_model=48,
                      d_mlp=96)
  params = hf_util.random_params(cfg, std=0.2, seed=1)
  tok = _bpe(tmp_path)
  assert tok.vocab_size < 450    # a model vocabulary larger than the tokenizer's is exported whole
  done = export.write_folder(hf_util.model(params, cfg, tok), str(tmp_path / "hf"))
  ids_BxT = np.random.default_rng(0).integers(0, 450, size=(2, cfg.max_len))
  ours = np.asarray(m.Transformer(cfg).apply({"params": params}, ids_BxT))
  np.testing.assert_allclose(hf_util.hf_logits(tmp_path / "hf", ids_BxT), ours, atol=1e-4)
  config = json.loads((tmp_path / "hf" / "config.json").read_text())
  assert (config["vocab_size"], config["n_positions"], config["tie_word_embeddings"]) == (
      450, 96, True)
  assert done["files"][:2] == ["model.safetensors", "config.json"]
  # And back, bit for bit: the parameters the folder holds are the run's.
  back = trained.from_hf(str(tmp_path / "hf"))
  jax.tree.map(np.testing.assert_array_equal, back.params, params)
  assert back.config == cfg and back.step == 7


@pytest.mark.parametrize("kind", ["bytes", "bpe", "bpe_chat"])
def test_auto_tokenizer_encodes_as_the_run_did_and_names_the_same_end_of_document(tmp_path, kind):
  tok = {"bytes": lambda: data_lib.load_tokenizer("bytes"), "bpe": lambda: _bpe(tmp_path),
         "bpe_chat": lambda: _bpe(tmp_path, ("<|im_start|>", "<|im_end|>"))}[kind]()
  cfg = m.ModelConfig(vocab_size=tok.vocab_size, max_len=32, num_layers=1, num_heads=2,
                      d_model=16, d_mlp=32)
  export.write_folder(hf_util.model(None, cfg, tok), str(tmp_path / "hf"))
  hf_tok = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "hf"))
  probes = PROBES + (["<|im_start|>user\nHi<|im_end|>\n"] if kind == "bpe_chat" else [])
  for text in probes:
    ours = tok.encode(text).tolist()
    assert hf_tok.encode(text) == ours, text
    assert hf_tok.encode(text, add_special_tokens=False) == ours, text
    assert hf_tok.decode(ours) == tok.decode(ours) == text, text
  # One id for the end of a document, wherever the folder names it.
  folder = tmp_path / "hf"
  config = json.loads((folder / "config.json").read_text())
  generation = json.loads((folder / "generation_config.json").read_text())
  assert {config["bos_token_id"], config["eos_token_id"], generation["eos_token_id"],
          generation["pad_token_id"], hf_tok.eos_token_id, hf_tok.bos_token_id,
          trained.from_hf(str(folder)).tokenizer.eod_id} == {tok.eod_id}


def test_invalid_utf8_decodes_alike():
  tok = data_lib.load_tokenizer("bytes")
  theirs = data_lib.HFTokenizer.__new__(data_lib.HFTokenizer)   # decode only: the file's decoder
  import tokenizers
  theirs._tok = tokenizers.Tokenizer.from_str(hf_files.byte_level_tokenizer_json())
  for ids in ([0xE6, 0x97], [0xFF, 0x41, 0xC3], [0xF0, 0x9F, 0x41], [0xED, 0xA0, 0x80, 0x41]):
    assert theirs.decode(ids) == tok.decode(ids), ids


def _jinja_template(tmp_path):
  """A Jinja template that reads eos_token ('</s>' in its tokenizer's configuration, where the
  export's is '<|endoftext|>') and marks the assistant's text with generation blocks."""
  folder = tmp_path / "tpl"
  folder.mkdir()
  (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": "</s>", "chat_template": (
      "{% for m in messages %}[{{ m.role }}] {% if m.role == 'assistant' %}{% generation %}"
      "{{ m.content }}{{ eos_token }}{% endgeneration %}{% else %}{{ m.content }}{% endif %}\n"
      "{% endfor %}{% if add_generation_prompt %}[assistant] {% endif %}")}))
  return str(folder)


@pytest.mark.parametrize("spec", ["chatml", "plain", "jinja"])
def test_the_exported_chat_template_renders_as_the_run_did(tmp_path, spec):
  spec = _jinja_template(tmp_path) if spec == "jinja" else spec
  template = load_chat_template(spec)
  done = export.write_folder(hf_util.model(template=spec), str(tmp_path / "hf"))
  assert done["chat_template"] == template.name
  hf_tok = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "hf"))
  for messages in (MESSAGES, MESSAGES[:3], MESSAGES[1:2]):
    for prompt in (False, True):
      theirs = hf_tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=prompt)
      assert theirs == render_chat(template, messages, add_generation_prompt=prompt)
  # The folder read back renders it the same way (sampling --chat from the folder).
  back = trained.from_hf(str(tmp_path / "hf")).chat_template()
  assert render_chat(back, MESSAGES, add_generation_prompt=True) == render_chat(
      template, MESSAGES, add_generation_prompt=True)


def test_a_text_generation_pipeline_runs_on_the_folder(tmp_path):
  export.write_folder(hf_util.model(), str(tmp_path / "hf"))
  pipe = transformers.pipeline("text-generation", model=str(tmp_path / "hf"), device="cpu")
  out = pipe("The ", max_new_tokens=5, do_sample=False)
  assert out[0]["generated_text"].startswith("The ")


def test_a_sentencepiece_run_is_exported_without_a_tokenizer_and_says_so(tmp_path, capsys):
  spm = pytest.importorskip("sentencepiece")
  from andrea_jax.data.corpora.synthetic import builtin_documents
  buffer = io.BytesIO()
  spm.SentencePieceTrainer.train(
      sentence_iterator=iter(builtin_documents("chat", 0.02)), model_writer=buffer,
      vocab_size=400, model_type="bpe", byte_fallback=True, bos_id=-1, eos_id=1, pad_id=-1,
      unk_id=0, minloglevel=3)
  (tmp_path / "sp.model").write_bytes(buffer.getvalue())
  tok = data_lib.load_tokenizer(str(tmp_path / "sp.model"))
  cfg = m.ModelConfig(vocab_size=400, max_len=32, num_layers=1, num_heads=2, d_model=16, d_mlp=32)
  done = export.write_folder(hf_util.model(None, cfg, tok), str(tmp_path / "hf"))
  assert "tokenizer.json" not in done["files"] and "tokenizer_config.json" not in done["files"]
  assert "SentencePiece" in capsys.readouterr().err
  assert "no tokenizer" in (tmp_path / "hf" / "README.md").read_text()
  assert json.loads((tmp_path / "hf" / "generation_config.json").read_text())["eos_token_id"] == 1


def test_the_folder_is_written_whole_or_not_at_all(tmp_path, monkeypatch):
  out = tmp_path / "hf"
  out.mkdir()
  (out / "mine.txt").write_text("keep me")
  with pytest.raises(FileExistsError, match="--out .*hf is not empty; pass --force to replace it"):
    export.write_folder(hf_util.model(), str(out))
  assert os.listdir(out) == ["mine.txt"]

  def broken(*a, **kw):
    raise OSError(28, "No space left on device")
  monkeypatch.setattr(hf_files, "write_tokenizer_files", broken)
  with pytest.raises(OSError, match=f"cannot write {out}: No space left on device"):
    export.write_folder(hf_util.model(), str(out), force=True)
  assert os.listdir(out) == ["mine.txt"] and sorted(os.listdir(tmp_path)) == ["hf"]
  monkeypatch.undo()
  export.write_folder(hf_util.model(), str(out), force=True)    # --force replaces it, once whole
  assert "mine.txt" not in os.listdir(out) and "model.safetensors" in os.listdir(out)
  assert sorted(os.listdir(tmp_path)) == ["hf"]


def test_the_pages_pipeline_block_runs_on_an_export(tmp_path, monkeypatch, capsys):
  """docs/lifecycle.md's python block, in a directory holding an export at the path it names."""
  from tests.test_docs import _blocks
  code = next(b for b in _blocks((REPO / "docs" / "lifecycle.md").read_text(), "python")
              if "pipeline" in b)
  export.write_folder(hf_util.model(), str(tmp_path / "runs" / "tiny-hf"))
  monkeypatch.chdir(tmp_path)
  exec(code, {})
  assert capsys.readouterr().out.startswith("def ")


def test_the_model_card_and_provenance_name_the_run(tmp_path):
  model = hf_util.model(origin="/runs/tiny", step=500)
  done = export.write_folder(model, str(tmp_path / "hf"))
  card = (tmp_path / "hf" / "README.md").read_text()
  assert "| step | 500 |" in card and done["sha256"] in card and "`/runs/tiny`" in card
  provenance = json.loads((tmp_path / "hf" / "andrea_run.json").read_text())
  assert provenance["step"] == 500 and provenance["sha256"] == done["sha256"]
  assert provenance["config"] == {"sources": ["a", "b"]}


@pytest.mark.slow
def test_the_command_line_exports_a_run_and_its_sampler_reads_both(tmp_path, data_cache):
  """A run of two steps, exported by the command; the same command again is refused without
  --force; a step that was not saved is named; the sampler reads the run and the folder alike."""
  from andrea_jax import train
  c = small_run_config(num_steps=2, optim__warmup_steps=1)
  train.train_and_evaluate(c, str(tmp_path / "run"))
  env = dict(os.environ, **hf_util.OFFLINE)
  cmd = [sys.executable, "-m", "andrea_jax.export", "--workdir", str(tmp_path / "run"),
         "--out", str(tmp_path / "hf")]
  go = lambda *a, module=None: subprocess.run(
      (cmd if module is None else [sys.executable, "-m", module]) + list(a), cwd=REPO,
      capture_output=True, text=True, env=env, timeout=600)
  out = go()
  assert out.returncode == 0, out.stderr
  assert f"exported {tmp_path / 'run'} step 2 to {tmp_path / 'hf'}" in out.stdout
  saved = trained.from_workdir(str(tmp_path / "run"))
  back = convert.load_safetensors(tmp_path / "hf", saved.config)
  vocab = saved.config.vocab_size   # the padding rows (never trained) are not exported
  for tree in (back, saved.params):
    tree["wte"] = {"embedding": np.asarray(tree["wte"]["embedding"])[:vocab]}
  jax.tree.map(np.testing.assert_array_equal, back, saved.params)
  again = go()
  assert again.returncode == 1 and again.stderr.startswith(
      f"error: --out {tmp_path / 'hf'} is not empty; pass --force to replace it")
  assert go("--force").returncode == 0
  missing = go("--step", "9", "--force")
  assert missing.returncode == 1 and "saved steps: [2]" in missing.stderr
  samples = []
  for source in (["--workdir", str(tmp_path / "run")], ["--hf", str(tmp_path / "hf")]):
    out = go(*source, "--prompt", "The ", "--greedy", "--max_new_tokens", "12", "--json",
             module="andrea_jax.sample")
    assert out.returncode == 0, out.stderr
    samples.append(json.loads(out.stdout)["samples"])
  assert samples[0] == samples[1]
