"""hub: Hugging Face datasets (made here, on disk: no network) prepared into shards and manifest."""

import json
import os

import numpy as np
import pytest

from andrea_jax.data import DataError, load_tokenizer, prepare, train_bpe
from andrea_jax.data.hub import datasets as hub
from andrea_jax.data.hub import templates as ct
from andrea_jax.data.hub.datasets import HubSpec
from andrea_jax.data.manifest import read_manifest

datasets = pytest.importorskip("datasets")
BYTES = load_tokenizer("bytes")


@pytest.fixture(autouse=True)
def _offline_datasets_cache(tmp_path, monkeypatch):
  """No network, and the datasets cache (json/parquet conversions) in the test's directory. The
  libraries read the offline switches when imported: set them there too."""
  import huggingface_hub.constants
  monkeypatch.setenv("HF_HUB_OFFLINE", "1")
  monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
  monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
  monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
  monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "hf_datasets_cache"))


def _save(tmp_path, rows, name="ds"):
  path = str(tmp_path / name)
  datasets.Dataset.from_list(rows).save_to_disk(path)
  return path


def _jsonl(tmp_path, rows, name="rows.jsonl"):
  path = tmp_path / name
  path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
  return str(path)


def _docs(out, source, tok=BYTES, split="train"):
  """The documents of a prepared source's split, decoded."""
  m = read_manifest(out)
  dtype = np.dtype(m["dtype"])
  tokens = np.concatenate([np.fromfile(os.path.join(out, s["file"]), dtype)
                           for s in m["sources"][source]["shards"][split]] or [np.zeros(0, dtype)])
  cuts = list(np.flatnonzero(tokens == tok.eod_id)) + [tokens.size]
  assert not tokens.size or cuts[0] == 0
  return [tok.decode(tokens[a + 1:b]) for a, b in zip(cuts[:-1], cuts[1:])]


def _prepare(specs, out, tok=BYTES, **kw):
  return prepare(specs, tok, str(out), progress=False, **kw)


def _tree(out):
  return {n: open(os.path.join(out, n), "rb").read() for n in sorted(os.listdir(out))
          if n.endswith(".bin") or n == "manifest.json"}


# ----- one test per conversation shape: the prepared document is the template, rendered by hand

def test_role_content_messages_smoltalk_shape(tmp_path):
  rows = [{"messages": [{"role": "user", "content": "What is 2+2?"},
                        {"role": "assistant", "content": "4."}], "source": "smol-x"},
          {"messages": [{"role": "system", "content": "Terse."},
                        {"role": "user", "content": "Héllo"},
                        {"role": "assistant", "content": "Hi."}], "source": "smol-y"}]
  spec = HubSpec(_save(tmp_path, rows), layout="messages", eval_fraction=0.0)
  _prepare({"smoltalk": spec}, tmp_path / "out")
  assert _docs(tmp_path / "out", "smoltalk") == [
      "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n4.<|im_end|>\n",
      ("<|im_start|>system\nTerse.<|im_end|>\n<|im_start|>user\nHéllo<|im_end|>\n"
       "<|im_start|>assistant\nHi.<|im_end|>\n")]


def test_from_value_conversations_sharegpt_hermes_shape(tmp_path):
  rows = [{"conversations": [{"from": "system", "value": "You are Hermes."},
                             {"from": "human", "value": "Name a colour."},
                             {"from": "gpt", "value": "Teal."}]}]
  spec = HubSpec("json", data_files=(_jsonl(tmp_path, rows),), layout="messages",
                 messages_field="conversations", eval_fraction=0.0)
  _prepare({"hermes3-general": spec}, tmp_path / "out")
  assert _docs(tmp_path / "out", "hermes3-general") == [
      ("<|im_start|>system\nYou are Hermes.<|im_end|>\n<|im_start|>user\nName a colour.<|im_end|>\n"
       "<|im_start|>assistant\nTeal.<|im_end|>\n")]


def test_system_prompt_in_its_own_field_plain_template(tmp_path):
  rows = [{"system": "Answer in French.", "chat": [{"role": "user", "content": "Hello"},
                                                  {"role": "assistant", "content": "Bonjour"}]},
          {"system": "", "chat": [{"role": "user", "content": "Bye"}]}]
  spec = HubSpec(_save(tmp_path, rows), layout="messages", messages_field="chat",
                 system_field="system", template="plain", eval_fraction=0.0)
  _prepare({"chat": spec}, tmp_path / "out")
  assert _docs(tmp_path / "out", "chat") == [
      "System: Answer in French.\n\nUser: Hello\n\nAssistant: Bonjour", "User: Bye"]


OASST = [  # two trees, in row order; tree 1 has two answers and a follow-up under the first
    {"message_id": "p1", "parent_id": None, "role": "prompter", "text": "Why is the sky blue?",
     "lang": "en"},
    {"message_id": "a1", "parent_id": "p1", "role": "assistant", "text": "Rayleigh scattering.",
     "lang": "en"},
    {"message_id": "a2", "parent_id": "p1", "role": "assistant", "text": "Short waves scatter.",
     "lang": "en"},
    {"message_id": "q1", "parent_id": "a1", "role": "prompter", "text": "And sunsets?",
     "lang": "en"},
    {"message_id": "p2", "parent_id": None, "role": "prompter", "text": "Bonjour ?", "lang": "fr"},
    {"message_id": "b1", "parent_id": "p2", "role": "assistant", "text": "Salut !", "lang": "fr"},
]


def test_openassistant_trees_become_every_root_to_leaf_thread(tmp_path):
  spec = HubSpec(_save(tmp_path, OASST), layout="tree", eval_fraction=0.0)
  _prepare({"oasst": spec}, tmp_path / "out")
  u = lambda t: f"<|im_start|>user\n{t}<|im_end|>\n"
  a = lambda t: f"<|im_start|>assistant\n{t}<|im_end|>\n"
  # Leaves in row order: a2 (row 2), q1 (row 3), b1 (row 5).
  assert _docs(tmp_path / "out", "oasst") == [
      u("Why is the sky blue?") + a("Short waves scatter."),
      u("Why is the sky blue?") + a("Rayleigh scattering.") + u("And sunsets?"),
      u("Bonjour ?") + a("Salut !")]
  # A filter keeps the threads all of whose messages pass it.
  fr = spec._replace(filter_field="lang", filter_value="fr")
  _prepare({"oasst": fr}, tmp_path / "fr")
  assert _docs(tmp_path / "fr", "oasst") == [u("Bonjour ?") + a("Salut !")]


def test_jinja_template_from_a_tokenizer_configuration(tmp_path):
  transformers = pytest.importorskip("transformers")
  template = ("{{ bos_token }}{% for m in messages %}{{ '<|' + m['role'] + '|>\n' + m['content'] "
              "+ eos_token + '\n' }}{% endfor %}")
  bpe_dir = tmp_path / "tok"
  bpe_dir.mkdir()
  train_bpe(["the cat sat on the mat " * 30], 300, bpe_dir / "base.json")
  markers = ["<|user|>", "<|assistant|>", "<s>"]
  tok = ct.add_chat_tokens(bpe_dir / "base.json", markers, bpe_dir / "tokenizer.json")
  config = {"tokenizer_class": "PreTrainedTokenizerFast", "chat_template": template,
            "bos_token": "<s>", "eos_token": "<|endoftext|>",
            "added_tokens_decoder": {str(int(tok.encode(m)[0])): {"content": m, "special": False}
                                     for m in markers}}
  (bpe_dir / "tokenizer_config.json").write_text(json.dumps(config))
  rows = [{"messages": [{"role": "user", "content": "the cat?"},
                        {"role": "assistant", "content": "on the mat"}]}]
  spec = HubSpec(_save(tmp_path, rows), layout="messages",
                 template=str(bpe_dir / "tokenizer_config.json"), eval_fraction=0.0)
  _prepare({"chat": spec}, tmp_path / "out", tok=tok)
  want = transformers.AutoTokenizer.from_pretrained(str(bpe_dir)).apply_chat_template(
      rows[0]["messages"], tokenize=False)
  assert want == "<s><|user|>\nthe cat?<|endoftext|>\n<|assistant|>\non the mat<|endoftext|>\n"
  assert _docs(tmp_path / "out", "chat", tok=tok) == [want]
  # Each marker is one id in the shard; the eos_token written by the template is text, never the
  # end-of-document id (one per document, at its start).
  m = read_manifest(str(tmp_path / "out"))
  ids = np.fromfile(tmp_path / "out" / m["sources"]["chat"]["shards"]["train"][0]["file"],
                    np.dtype(m["dtype"]))
  assert int((ids == tok.eod_id).sum()) == 1
  for marker in markers:
    assert int((ids == int(tok.encode(marker)[0])).sum()) == want.count(marker)
  assert m["sources"]["chat"]["inputs"]["template"]["kind"] == "jinja"
  assert m["sources"]["chat"]["inputs"]["read"]["template"].endswith("tokenizer_config.json")


def test_chatml_markers_must_be_single_ids_of_the_tokenizer(tmp_path):
  train_bpe(["hello there " * 30], 300, tmp_path / "bpe.json")
  spec = HubSpec(_save(tmp_path, [{"messages": [{"role": "user", "content": "hello"}]}]),
                 layout="messages")
  with pytest.raises(DataError, match=r"splits the chat marker '<\|im_start\|>'"):
    _prepare({"chat": spec}, tmp_path / "out", tok=load_tokenizer(tmp_path / "bpe.json"))
  tok = ct.add_chat_tokens(tmp_path / "bpe.json", ct.CHATML_MARKERS, tmp_path / "chat.json")
  _prepare({"chat": spec._replace(eval_fraction=0.0)}, tmp_path / "out", tok=tok)
  assert _docs(tmp_path / "out", "chat", tok=tok) == [
      "<|im_start|>user\nhello<|im_end|>\n"]


# ----- one dataset, several sources; streaming; budgets; data files -----

def test_a_filter_splits_one_dataset_into_two_sources(tmp_path):
  rows = [{"text": f"document {i}", "category": ["general", "creative", "roleplay"][i % 3]}
          for i in range(30)]
  path = _save(tmp_path, rows)
  specs = {"hermes3-general": HubSpec(path, filter_field="category", filter_value="general",
                                      eval_fraction=0.0),
           "hermes3-creative": HubSpec(path, filter_field="category",
                                       filter_value=("creative", "roleplay"), eval_fraction=0.0)}
  _prepare(specs, tmp_path / "out")
  assert _docs(tmp_path / "out", "hermes3-general") == [f"document {i}" for i in range(0, 30, 3)]
  assert _docs(tmp_path / "out", "hermes3-creative") == [f"document {i}" for i in range(30)
                                                         if i % 3]


@pytest.mark.parametrize("kind", ["save_to_disk", "jsonl", "parquet"])
def test_streaming_and_not_give_identical_shards(tmp_path, kind, monkeypatch):
  monkeypatch.setattr(hub, "BATCH_ROWS", 7)   # several batches, a budget cut inside one
  rng = np.random.default_rng(0)
  rows = [{"messages": [{"role": "user", "content": f"q{i} " + "x" * int(rng.integers(0, 40))},
                        {"role": "assistant", "content": f"a{i}"}],
           "lang": ["en", "fr"][i % 2]} for i in range(60)]
  if kind == "save_to_disk":
    spec = HubSpec(_save(tmp_path, rows))
  elif kind == "jsonl":
    spec = HubSpec("", data_files=(_jsonl(tmp_path, rows),))
  else:
    import pyarrow as pa
    import pyarrow.parquet as pq
    pq.write_table(pa.Table.from_pylist(rows), str(tmp_path / "rows.parquet"), row_group_size=9)
    spec = HubSpec("", data_files=(str(tmp_path / "rows.parquet"),))
  spec = spec._replace(layout="messages", filter_field="lang", filter_value="en", eval_fraction=0.1,
                       max_tokens=1500)
  _prepare({"smoltalk": spec}, tmp_path / "a")
  _prepare({"smoltalk": spec._replace(streaming=True)}, tmp_path / "b")
  a, b = _tree(tmp_path / "a"), _tree(tmp_path / "b")
  assert a.keys() == b.keys()
  for name in a:
    if name != "manifest.json":
      assert a[name] == b[name], name
  entry = read_manifest(str(tmp_path / "a"))["sources"]["smoltalk"]
  # The budget, by hand: documents are the English rows (even i), each len(utf8) + 1 byte tokens;
  # take the longest prefix whose sum is <= 1500.
  lengths = [len(f"<|im_start|>user\n{r['messages'][0]['content']}<|im_end|>\n<|im_start|>"
                 f"assistant\n{r['messages'][1]['content']}<|im_end|>\n".encode()) + 1
             for r in rows[::2]]
  take = int(np.searchsorted(np.cumsum(lengths), 1500, side="right"))
  assert 0 < take < len(lengths)
  assert sum(entry["documents"].values()) == take
  assert sum(entry["tokens"].values()) == sum(lengths[:take])


def test_cached_preparation_is_reused_and_redone_when_an_input_changes(tmp_path):
  rows = [{"text": f"row {i}", "k": i % 2} for i in range(20)]
  path = _save(tmp_path, rows)
  spec = HubSpec(path, filter_field="k", filter_value=0)
  out = tmp_path / "out"
  assert _prepare({"chat": spec}, out).prepared == ("chat",)
  inputs = read_manifest(str(out))["sources"]["chat"]["inputs"]
  with open(os.path.join(path, "state.json")) as f:
    state = json.load(f)
  assert inputs["dataset"]["fingerprint"] == state["_fingerprint"]
  assert inputs["dataset"]["kind"] == "disk" and inputs["filter"] == {"field": "k", "value": 0}
  assert _prepare({"chat": spec}, out).skipped == ("chat",)
  assert _prepare({"chat": spec._replace(streaming=True)}, out).skipped == ("chat",)
  for changed in (spec._replace(filter_value=1), spec._replace(max_tokens=30),
                  spec._replace(eval_fraction=0.5)):
    assert _prepare({"chat": changed}, out).prepared == ("chat",)
    assert _prepare({"chat": spec}, out).prepared == ("chat",)
  # A message dataset: changing the template redoes it.
  msgs = _save(tmp_path, [{"messages": [{"role": "user", "content": "x"}]}], "msgs")
  m_spec = HubSpec(msgs, layout="messages")
  assert _prepare({"oasst": m_spec}, out).prepared == ("oasst",)
  assert _prepare({"oasst": m_spec._replace(template="plain")}, out).prepared == ("oasst",)
  # The same directory saved again with other rows is another dataset.
  datasets.Dataset.from_list(rows[:10]).save_to_disk(str(tmp_path / "tmp"))
  datasets.load_from_disk(str(tmp_path / "tmp")).save_to_disk(path + "2")
  assert _prepare({"chat": spec._replace(dataset=path + "2")}, out).prepared == ("chat",)
  assert _docs(out, "chat", split="train") + _docs(out, "chat", split="eval") != []


def test_an_interrupted_source_is_redone_alone(tmp_path, monkeypatch):
  monkeypatch.setattr(hub, "BATCH_ROWS", 4)
  path = _save(tmp_path, [{"text": f"t{i}", "c": "ab"[i % 2]} for i in range(40)])
  specs = {"chat": HubSpec(path, filter_field="c", filter_value="a"),
           "smoltalk": HubSpec(path, filter_field="c", filter_value="b")}
  _prepare(specs, tmp_path / "fresh")
  documents = hub.documents

  def interrupted(source, *a, **kw):
    for i, batch in enumerate(documents(source, *a, **kw)):
      if source == "smoltalk" and i == 2:
        raise KeyboardInterrupt
      yield batch

  monkeypatch.setattr(hub, "documents", interrupted)
  with pytest.raises(KeyboardInterrupt):
    _prepare(specs, tmp_path / "out")
  assert list(read_manifest(str(tmp_path / "out"))["sources"]) == ["chat"]
  monkeypatch.setattr(hub, "documents", documents)
  result = _prepare(specs, tmp_path / "out")
  assert (result.prepared, result.skipped) == (("smoltalk",), ("chat",))
  assert _tree(tmp_path / "out") == _tree(tmp_path / "fresh")
  assert not [n for n in os.listdir(tmp_path / "out") if ".tmp" in n]


def test_datasetdict_split_and_unknown_split(tmp_path):
  dd = datasets.DatasetDict({"train": datasets.Dataset.from_list([{"text": "tr"}]),
                             "test": datasets.Dataset.from_list([{"text": "te"}])})
  dd.save_to_disk(str(tmp_path / "dd"))
  _prepare({"chat": HubSpec(str(tmp_path / "dd"), split="test", eval_fraction=0.0)},
           tmp_path / "out")
  assert _docs(tmp_path / "out", "chat") == ["te"]
  with pytest.raises(DataError, match=r"has no split 'validation' \(splits: \['test', 'train'\]\)"):
    _prepare({"chat": HubSpec(str(tmp_path / "dd"), split="validation")}, tmp_path / "out")


# ----- bad rows: the error names the dataset, the split and the row -----

def _bad(tmp_path, rows, match, **kw):
  spec = HubSpec(_save(tmp_path, rows), layout=kw.pop("layout", "messages"), **kw)
  with pytest.raises(DataError, match=match):
    _prepare({"chat": spec}, tmp_path / "out")
  return spec


GOOD = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]


@pytest.mark.parametrize("rows, match", [
    ([{"messages": GOOD}, {"messages": None}], r"row 1: missing field 'messages'"),
    ([{"messages": GOOD}, {"messages": GOOD}, {"messages": [{"content": "no role"}]}],
     r"row 2: message 0 has no role"),
    ([{"messages": GOOD}, {"messages": [{"role": "user", "content": None}]}],
     r"row 1: message 0 \(user\) has content of type NoneType .* not a string"),
    ([{"messages": [{"role": "user", "content": "x"}, {"role": "narrator", "content": "y"}]}],
     r"row 0: message 1 has the unknown role 'narrator'"),
    ([{"messages": GOOD}, {"messages": GOOD}, {"messages": GOOD}, {"messages": []}],
     r"row 3: empty conversation"),
])
def test_bad_message_rows(tmp_path, rows, match):
  spec = _bad(tmp_path, rows, rf"source 'chat': dataset '.*ds', split 'train', {match}")
  # Streaming reads the same rows and says the same.
  with pytest.raises(DataError, match=match):
    _prepare({"chat": spec._replace(streaming=True)}, tmp_path / "out")


def test_bad_rows_other_layouts(tmp_path):
  _bad(tmp_path, [{"messages": [{"role": "user", "content": ["a", "b"]}]}],
       r"row 0: message 0 \(user\) has content of type list", )
  _bad(tmp_path / "t", [{"text": "ok"}, {"text": None}], r"split 'train', row 1: missing field "
       r"'text'", layout="text")
  _bad(tmp_path / "c", [{"body": "x"}], r"has no field 'text' \(fields: \['body'\]\)",
       layout="text")
  loop = OASST[:2] + [{**OASST[4], "parent_id": "b1"}, OASST[5]]   # p2 <-> b1, no root
  _bad(tmp_path / "l", loop, r"source 'chat': dataset '.*', split 'train', row 2: messages "
       r"\['p2', 'b1'\] answer one another in a closed loop", layout="tree")
  orphan = OASST[:4] + [{**OASST[5], "parent_id": "gone"}]
  _bad(tmp_path / "o", orphan, r"row 4: message 'b1' answers parent 'gone', which is not in the "
       r"split \(a tree whose parent is missing\)", layout="tree")
  rows = [{"messages": GOOD}] * 3
  path = tmp_path / "j" / "rows.jsonl"
  path.parent.mkdir()
  path.write_text("".join(json.dumps(r) + "\n" for r in rows) + json.dumps({"messages": [
      {"from": "human", "value": "hi"}, {"from": "dog", "value": "woof"}]}) + "\n")
  for streaming in (False, True):
    with pytest.raises(DataError, match=r"split 'train', row 3: message 1 has the unknown role "
                       r"'dog'"):
      _prepare({"chat": HubSpec("json", data_files=(str(path),), layout="messages",
                                streaming=streaming)}, tmp_path / "j" / "out")


def test_specs_are_checked_with_the_field_named(tmp_path):
  path = _save(tmp_path, [{"text": "x"}])
  for spec, match in [
      (HubSpec(path, layout="tabular"), r"layout must be one of .* got 'tabular'"),
      (HubSpec(path, max_tokens=-1), r"max_tokens must be >= 0, got -1"),
      (HubSpec("nope", data_files=("a.txt",)), r"dataset must be one of \('json'"),
      (HubSpec(path, filter_field="x", filter_value={"a": 1}), r"filter_value must be"),
      (HubSpec(str(tmp_path)), r"was not written by save_to_disk"),
      (HubSpec("./no/such/dir"), r"dataset looks like a path but is no directory")]:
    with pytest.raises(ValueError, match=match):
      _prepare({"chat": spec}, tmp_path / "out")


def test_missing_datasets_library_says_how_to_install(monkeypatch):
  import sys
  monkeypatch.setitem(sys.modules, "datasets", None)
  with pytest.raises(ImportError, match=r"pip install 'andrea_jax\[hub\]'"):
    hub.require_datasets()


def test_andrea_sources_cover_the_seed_sources_once_with_valid_specs():
  from andrea_jax.data.hub.andrea_sources import HUB_SOURCES, UNVERIFIED
  from andrea_jax.sources import SEED_SOURCES
  assert not set(HUB_SOURCES) & set(UNVERIFIED)
  assert set(HUB_SOURCES) | set(UNVERIFIED) == set(SEED_SOURCES)
  for name, source in HUB_SOURCES.items():
    hub.check_hub_spec(name, source.spec)
    assert source.evidence and all(u.startswith("https://huggingface.co/") for u in source.evidence)
