"""Data formats by name: each source's section made from its format's fields, a format of one's own
picked as ``"package.module:factory"``, the switch on the command line, errors naming the field,
and a ``data`` section checked once into a typed spec that the pipeline takes as it is."""

import json
import subprocess
import sys

import pytest
from absl import flags
from ml_collections import config_flags

from andrea_jax import runconfig
from andrea_jax.config import load_config_file
from andrea_jax.data import (DataSpec, PreparedData, Source, data_config, data_spec,
                             load_tokenizer, open_training_data, prepare, set_source,
                             source_files)
from andrea_jax.data import config as config_lib
from andrea_jax.data import formats, pipeline
from andrea_jax.data.hub.spec import HubSpec
from tests.util import REPO, set_fields, small_run_config

BYTES = load_tokenizer("bytes")
OWN_DATA = REPO / "experiments" / "own_data.py"

# A format of one's own, in one file: a file reader (one document per non-blank line, lower-cased
# when asked, each line of at least min_chars characters) and a dataset reader (numbered documents).
MY_FORMATS = '''
import dataclasses


@dataclasses.dataclass(frozen=True)
class Lines:
  paths: str = ""
  min_chars: int = 1
  lower: bool = False

  def __post_init__(self):
    if self.min_chars < 1:
      raise ValueError(f"min_chars must be >= 1, got {self.min_chars}")

  def units(self, path):
    return [(path, half) for half in (0, 1)]     # even lines, then odd lines

  def read(self, unit):
    path, half = unit
    lines = open(path, encoding="utf-8").read().splitlines()[half::2]
    return [(l.lower() if self.lower else l) for l in lines if len(l) >= self.min_chars]


class _Counting:
  def __init__(self, count, word):
    self.count, self.word = count, word

  def documents(self, source, progress):
    for start in range(0, self.count, 3):
      yield [f"{self.word} {i}" for i in range(start, min(start + 3, self.count))]


def counting(count: int = 10, word: str = "document"):
  return _Counting(count, word)
'''


@pytest.fixture
def my_formats(tmp_path, monkeypatch):
  (tmp_path / "my_formats.py").write_text(MY_FORMATS)
  monkeypatch.syspath_prepend(str(tmp_path))
  monkeypatch.setenv("PYTHONPATH", str(tmp_path))   # the spawned workers import it too
  yield "my_formats"
  sys.modules.pop("my_formats", None)


def test_each_builtin_section_holds_its_formats_fields_and_the_common_ones():
  common = {"format", "eval_fraction", "max_tokens"}
  assert set(source_files("jsonl").keys()) == common | {"paths", "text_field"}
  assert set(source_files("text").keys()) == common | {"paths", "separator"}
  assert set(source_files("parquet").keys()) == common | {"paths", "text_field"}
  hub = set(source_files("hf").keys())
  assert {"dataset", "layout", "template", "loss_on", "streaming"} <= hub
  assert "separator" not in hub and "text_field" not in source_files("text")
  # The default: JSON Lines with no paths, a source with no data.
  default = data_config().files.chat
  assert default.format == "jsonl" and not formats.has_data(default)
  assert default.eval_fraction is None and default.max_tokens == 0


def test_a_section_is_checked_into_a_typed_source():
  spec = data_spec(_files(docs=source_files("text", paths="a.txt, b.txt", separator="%%",
                                            max_tokens=500, eval_fraction=0.2)), ("docs",))
  assert isinstance(spec, DataSpec) and spec.corpus == "files"
  source = spec.files["docs"]
  assert source == Source("text", (("paths", "a.txt, b.txt"), ("separator", "%%")), 0.2, 500)
  assert source.reader.separator == "%%"
  hub = data_spec(_files(chat=source_files("hf", dataset="json", paths="c.jsonl",
                                           layout="messages", filter_value="en, fr")),
                  ("chat",)).files["chat"]
  assert isinstance(hub.reader, HubSpec)
  assert hub.reader.data_files == ("c.jsonl",) and hub.reader.filter_value == ["en", "fr"]
  assert hub.eval_fraction == 0.01   # the data section's


def _files(**sections):
  cfg = data_config(tuple(sections), corpus="files")
  for name, section in sections.items():
    cfg.files[name] = section
  return cfg


@pytest.mark.parametrize("change, match", [
    (dict(format="csv"), r"data\.files\.docs\.format = 'csv': not a built-in format "
                         r"\(jsonl, text, parquet, hf\); a format of your own is named "
                         r"'package\.module:factory'"),
    (dict(format="no_such_module:reader"), r"data\.files\.docs\.format = "
                                           r"'no_such_module:reader': cannot import"),
    (dict(text_field=""), r"data\.files\.docs\.text_field must not be empty"),
    (dict(text_field=3), r"data\.files\.docs\.text_field must be a string, got 3"),
    (dict(eval_fraction=0.9), r"data\.files\.docs\.eval_fraction must be in \[0, 0\.5\], "
                              r"got 0\.9"),
    (dict(max_tokens=-1), r"data\.files\.docs\.max_tokens must be >= 0, got -1"),
    (dict(max_tokens=True), r"data\.files\.docs\.max_tokens must be an integer, got True"),
    (dict(separator="|"), r"data\.files\.docs has fields \['separator'\] that format 'jsonl' "
                          r"does not take .*or set format 'text', which takes them"),
])
def test_every_bad_field_is_named_with_its_value(change, match):
  section = {**source_files("jsonl", paths="a.jsonl").to_dict(), **change}   # types unchecked
  cfg = _files(docs=section)
  with pytest.raises((ValueError, TypeError), match=match):
    data_spec(cfg, ("docs",))


def test_bad_hub_fields_are_named_before_anything_is_read():
  cfg = _files(chat=source_files("hf", dataset="json", paths="c.jsonl", layout="rows"))
  with pytest.raises(ValueError, match=r"data\.files\.chat\.layout must be one of \('text', "
                                       r"'messages', 'tree'\), got 'rows'"):
    data_spec(cfg, ("chat",))
  cfg.files.chat.layout = "messages"
  cfg.files.chat.dataset = "./no/such/dir"
  cfg.files.chat.paths = ""
  with pytest.raises(ValueError, match=r"data\.files\.chat\.dataset looks like a path but is no "
                                       r"directory"):
    data_spec(cfg, ("chat",))


def test_a_format_of_ones_own_is_picked_by_name_and_read_like_a_builtin(my_formats, tmp_path):
  path = tmp_path / "lines.txt"
  path.write_text("Alpha\nbe\nGamma ray\n\nDelta\n")
  section = source_files(f"{my_formats}:Lines", paths=str(path), lower=True)
  assert sorted(section.keys()) == ["eval_fraction", "format", "lower", "max_tokens",
                                    "min_chars", "paths"]
  section.min_chars = 3
  spec = data_spec(_files(mine=section), ("mine",))
  source = spec.files["mine"]
  assert source.format == "my_formats:Lines" and dict(source.arguments)["lower"] is True
  source = source._replace(eval_fraction=0.0)
  out = tmp_path / "prepared"
  result = prepare({"mine": source}, BYTES, str(out), workers=2, progress=False,
                   known_sources=("mine",))
  assert result.prepared == ("mine",)
  # Even lines, then odd ones; shorter than 3 characters dropped; lower-cased.
  docs = ["alpha", "gamma ray", "delta"]
  tokens = PreparedData.open(str(out), sources=("mine",)).shards("mine")[0]
  assert tokens.tolist() == [t for d in docs for t in [256, *d.encode()]]
  entry = json.loads((out / "manifest.json").read_text())["sources"]["mine"]
  assert entry["inputs"]["format"] == "my_formats:Lines"
  assert entry["inputs"]["arguments"] == {"paths": str(path), "min_chars": 3, "lower": True}
  # Its own check, named as a built-in's.
  section.min_chars = 0
  with pytest.raises(ValueError, match=r"data\.files\.mine\.min_chars must be >= 1, got 0"):
    data_spec(_files(mine=section), ("mine",))
  with pytest.raises(TypeError, match=r"data\.files\.mine\.min_chars must be an integer, "
                                      r"got '3'"):
    data_spec(_files(mine={**section.to_dict(), "min_chars": "3"}), ("mine",))


def test_a_dataset_reader_of_ones_own_yields_documents(my_formats, tmp_path):
  cfg = _files(nums=source_files(f"{my_formats}:counting", count=7, word="doc"))
  cfg.cache_dir = str(tmp_path / "cache")
  cfg.eval_fraction = 0.0
  cfg.seq_len = 8
  spec = data_spec(cfg, ("nums",))
  assert formats.has_data(cfg.files.nums)   # a format without paths or dataset always has data
  data = open_training_data(spec, progress=False)
  docs = [f"doc {i}" for i in range(7)]
  assert data.shards("nums")[0].tolist() == [t for d in docs for t in [256, *d.encode()]]
  assert data.path == pipeline.files_prepared_dir(spec)


def test_the_command_line_switches_a_sources_format(tmp_path):
  """``--config.data.files.<s>.format`` makes the section anew for the format before the other
  overrides are read (as ``main`` and ``prepare`` install it), keeping the fields both formats
  take; a field the new format does not take is refused, named."""
  config = _parse(tmp_path, "--config.data.files.docs.paths=corpus/docs/*.txt",
                  "--config.data.files.docs.max_tokens=1000",
                  "--config.data.files.docs.format=text", "--config.data.files.docs.separator=%%",
                  "--config.data.files.reference.format=hf",
                  "--config.data.files.reference.dataset=HuggingFaceTB/smoltalk",
                  "--config.data.files.reference.streaming",
                  "--config.data.files.code.format", "parquet",
                  "--config.data.files.code.text_field=body")
  docs, ref, code = (config.data.files[n] for n in ("docs", "reference", "code"))
  assert (docs.format, docs.paths, docs.separator, docs.max_tokens) == (
      "text", "corpus/docs/*.txt", "%%", 1000)
  assert "text_field" not in docs and "dataset" not in docs
  assert (ref.format, ref.dataset, ref.streaming, ref.split) == (
      "hf", "HuggingFaceTB/smoltalk", True, "train")
  assert (code.format, code.text_field) == ("parquet", "body")
  with pytest.raises(flags.IllegalFlagValueError,
                     match=r"--config\.data\.files\.docs\.text_field is not a field of format "
                           r"'text' \(its fields: \['eval_fraction', 'max_tokens', 'paths', "
                           r"'separator'\]\)"):
    _parse(tmp_path, "--config.data.files.docs.format=text",
           "--config.data.files.docs.text_field=body")


def _parse(tmp_path, *overrides):
  argv = ["prog", f"--config={OWN_DATA}:code,docs,reference", *overrides]
  fv = flags.FlagValues()
  config_flags.DEFINE_config_file("config", None, "", flag_values=fv, lock_config=True,
                                  sys_argv=argv)
  formats.switch_on_parse(fv["config"], argv)
  fv(argv)
  return fv.config


def test_python_configs_set_a_sources_format_with_set_source_or_the_overrides(tmp_path):
  c = load_config_file(f"{OWN_DATA}:code,docs")
  set_source(c, "docs", "text", paths=str(REPO / "README.md"))
  set_fields(c, {"data.files.code.format": "hf", "data.files.code.dataset": "json",
                 "data.files.code.paths": str(REPO / "README.md")})
  assert c.data.files.docs.format == "text" and c.data.files.code.layout == "text"
  run = runconfig.build(c)
  assert run.data.files["docs"].format == "text" and run.data.files["code"].format == "hf"
  with pytest.raises(ValueError, match=r"'reference' is not a source of the config"):
    set_source(c, "reference", "text")


def test_the_run_holds_the_typed_spec_and_the_pipeline_never_checks_it_again(
    tmp_path, monkeypatch, data_cache):
  """``runconfig.build`` checks the data section once and loads the tokenizer once;
  ``open_training_data`` takes ``run.data`` as it is (no section, no second check, no reload)."""
  c = small_run_config()
  loads = []
  real = config_lib.load_tokenizer
  monkeypatch.setattr(config_lib, "load_tokenizer", lambda s: loads.append(s) or real(s))
  run = runconfig.build(c)
  assert loads == ["bytes"] and isinstance(run.data, DataSpec)
  assert run.data.micro_batch_size == run.data.global_batch_size == 16

  def never(*args, **kwargs):
    raise AssertionError("the data section is checked again")

  monkeypatch.setattr(config_lib, "data_spec", never)
  monkeypatch.setattr(config_lib, "load_tokenizer", never)
  monkeypatch.setattr("andrea_jax.data.tokenizers.load_tokenizer", never)
  data = open_training_data(run.data, required=run.evaluated, progress=False)
  assert data.tokenizer_name == "bytes" and data.has("chat")


@pytest.mark.slow
def test_main_refuses_a_field_the_new_format_does_not_take(tmp_path):
  out = subprocess.run(
      [sys.executable, "-m", "andrea_jax.main", f"--config={OWN_DATA}:docs",
       f"--workdir={tmp_path / 'run'}", "--config.data.files.docs.format=text",
       "--config.data.files.docs.text_field=body"],
      cwd=REPO, capture_output=True, text=True, timeout=300)
  assert out.returncode == 1
  assert ("--config.data.files.docs.text_field is not a field of format 'text'"
          in out.stderr), out.stderr[-2000:]
  assert not (tmp_path / "run").exists()


def test_the_format_code_a_new_format_touches_is_one_module():
  """The built-in formats are listed once (:data:`formats.BUILTIN`); a user's is found by name
  through the same function."""
  assert list(formats.BUILTIN) == ["jsonl", "text", "parquet", "hf"]
  assert formats.factory("jsonl") is formats.BUILTIN["jsonl"]
  assert formats.factory("andrea_jax.data.readers:Text") is formats.BUILTIN["text"]
  with pytest.raises(ValueError, match=r"module 'andrea_jax\.data\.readers' has no "
                                       r"'Nope'"):
    formats.factory("andrea_jax.data.readers:Nope")
