"""chat_files: the template files transformers 4 and 5 write, template files alone, the Hub (a
local cache, offline); and every field a template reads (message fields, a dataset's tools), each
rendering compared with transformers' apply_chat_template."""

import json
import os

import pytest

from andrea_jax.data import DataError, chat, chat_files, load_tokenizer, prepare, train_bpe
from andrea_jax.data import chat_templates as ct
from andrea_jax.data.hub import HubSpec

transformers = pytest.importorskip("transformers")
datasets = pytest.importorskip("datasets")

# Reads the special tokens, every field of a message, and the tools.
RICH = ("{{ bos_token }}{% if tools %}<|tools|>{{ tools | tojson }}\n{% endif %}"
        "{% for m in messages %}<|{{ m.role }}|>{% if m.name is defined %}({{ m.name }}){% endif %}"
        "\n{% if m.reasoning_content is defined %}<think>{{ m.reasoning_content }}</think>"
        "{% endif %}{% if m.content is defined %}{{ m.content }}{% endif %}"
        "{% if m.tool_calls is defined %}{% for c in m.tool_calls %}<call>{{ c.function.name }}"
        "({{ c.function.arguments }})</call>{% endfor %}{% endif %}{{ eos_token }}\n{% endfor %}")
TOOL_USE = ("<|tool-template|>{{ tools | map(attribute='name') | join(',') }}\n"
            "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}")
CONVERSATION = [
    {"role": "system", "content": "Réponds brièvement. 简短回答 🙂"},
    {"role": "user", "content": "Quel temps ?", "name": "alice"},
    {"role": "assistant", "content": "", "reasoning_content": "look it up",
     "tool_calls": [{"type": "function",
                     "function": {"name": "weather", "arguments": "{\"city\": \"Paris\"}"}}]},
    {"role": "tool", "content": "soleil", "name": "weather"},
    {"role": "assistant", "content": "Il fait beau ☀️."},
]
TOOLS = [{"name": "weather", "description": "today's weather",
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}]


def _saved_tokenizer(folder, template, **special):
  """A transformers 5 tokenizer folder (``save_pretrained``): tokenizer.json (a small BPE with the
  template's markers added), tokenizer_config.json, chat_template.jinja (and
  additional_chat_templates/ for a dict of templates)."""
  folder.mkdir(parents=True, exist_ok=True)
  train_bpe(["hello world, the weather " * 20], 300, folder / "bpe.json")
  tok = transformers.PreTrainedTokenizerFast(tokenizer_file=str(folder / "bpe.json"), **special)
  tok.add_tokens(["<|system|>", "<|user|>", "<|assistant|>", "<|tool|>", "<|tools|>"])
  tok.chat_template = template
  tok.save_pretrained(str(folder))
  os.remove(folder / "bpe.json")
  return folder


def test_a_transformers_5_folder_its_config_and_its_jinja_render_as_transformers(tmp_path):
  folder = _saved_tokenizer(tmp_path / "tok", RICH, bos_token="<s>", eos_token="</s>")
  config = json.loads((folder / "tokenizer_config.json").read_text())
  assert "chat_template" not in config and (folder / "chat_template.jinja").exists()
  reference = transformers.AutoTokenizer.from_pretrained(str(folder))
  want = reference.apply_chat_template(CONVERSATION, tools=TOOLS, tokenize=False)
  assert want.startswith("<s><|tools|>[{\"name\": \"weather\"") and "(alice)" in want
  assert "<think>look it up</think><call>weather({\"city\": \"Paris\"})</call></s>" in want
  for spec in (folder, folder / "tokenizer_config.json", folder / "chat_template.jinja"):
    template = chat_files.load_chat_template(str(spec))
    assert dict(template.tokens) == {"bos_token": "<s>", "eos_token": "</s>"}
    # The markers: tokenizer.json's added tokens (transformers 5 writes none in the
    # configuration) spelled in the template, and the special tokens it names; '<|user|>' is
    # built from pieces ('<|' + role + '|>'), so not found, as transformers does not find it.
    assert set(template.markers) == {"<s>", "</s>", "<|tools|>"}
    got = ct.render_chat(template, chat.normalize_messages(CONVERSATION), TOOLS)
    assert got == want, spec
  # Without tools, no tools block: as transformers.
  assert ct.render_chat(chat_files.load_chat_template(str(folder)),
                        chat.normalize_messages(CONVERSATION)) == reference.apply_chat_template(
                            CONVERSATION, tokenize=False)


def test_named_templates_and_the_tool_use_template_as_transformers_picks_them(tmp_path):
  folder = _saved_tokenizer(tmp_path / "tok", {"default": RICH, "tool_use": TOOL_USE},
                            bos_token="<s>", eos_token="</s>")
  assert (folder / "additional_chat_templates" / "tool_use.jinja").exists()
  reference = transformers.AutoTokenizer.from_pretrained(str(folder))
  messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
  template = chat_files.load_chat_template(str(folder))
  assert template.tool_source == TOOL_USE
  # No tools: the default template; tools: the tool_use one (transformers' get_chat_template).
  for tools in (None, TOOLS):
    want = reference.apply_chat_template(messages, tools=tools, tokenize=False)
    assert ct.render_chat(template, messages, tools) == want
  assert ct.render_chat(template, messages, TOOLS) == "<|tool-template|>weather\nuser: hi\nassistant: yo\n"
  # A named template is kept whatever the row (transformers: chat_template="default").
  named = chat_files.load_chat_template(f"{folder}::default")
  assert named.tool_source == "" and ct.render_chat(named, messages, TOOLS) == \
      reference.apply_chat_template(messages, tools=TOOLS, tokenize=False, chat_template="default")
  assert chat_files.load_chat_template(f"{folder}::tool_use").source == TOOL_USE
  with pytest.raises(DataError, match=r"no chat template named 'nope' \(has \['default', "
                                      r"'tool_use'\]\)"):
    chat_files.load_chat_template(f"{folder}::nope")


def test_a_legacy_chat_template_json_and_special_tokens_map(tmp_path):
  folder = tmp_path / "legacy"
  folder.mkdir()
  (folder / "chat_template.json").write_text(json.dumps(
      {"chat_template": "{% for m in messages %}{{ m.content }}{{ eos_token }}{% endfor %}"}))
  (folder / "special_tokens_map.json").write_text(json.dumps({"eos_token": {"content": "<e>"}}))
  template = chat_files.load_chat_template(str(folder))
  assert ct.render_chat(template, [{"role": "user", "content": "a"}]) == "a<e>"
  # The file alone: its tokens from the folder it sits in.
  alone = chat_files.load_chat_template(str(folder / "chat_template.json"))
  assert ct.render_chat(alone, [{"role": "user", "content": "a"}]) == "a<e>"


def test_a_jinja_file_without_its_tokenizer_says_what_it_lacks(tmp_path):
  (tmp_path / "t.jinja").write_text("{% for m in messages %}{{ m.content + eos_token }}{% endfor %}")
  with pytest.raises(DataError, match=r"reads \['eos_token'\], which only a tokenizer "
                                      r"configuration defines: put the template beside its "
                                      r"tokenizer_config.json"):
    chat_files.load_chat_template(str(tmp_path / "t.jinja"))
  # A template reading no special token needs none; its markers are its <|...|> strings.
  (tmp_path / "u.jinja").write_text("{% for m in messages %}<|{{ m.role }}|>{{ m.content }}"
                                    "<|end|>{% endfor %}")
  plain = chat_files.load_chat_template(str(tmp_path / "u.jinja"))
  assert plain.markers == ("<|end|>",)
  (tmp_path / "v.jinja").write_text("{% for m in messages %}{{ m.content }}{% endfor %")
  with pytest.raises(DataError, match="Jinja syntax error at line 1"):
    chat_files.load_chat_template(str(tmp_path / "v.jinja"))
  for bad, match in ((tmp_path, "holds no tokenizer_config.json, chat_template.jinja"),
                     (tmp_path / "missing.jinja", "neither 'chatml', 'plain'")):
    with pytest.raises(DataError, match=match):
      chat_files.load_chat_template(str(bad))


def _hub_cache(root, repo, files: dict[str, str]) -> None:
  """The Hugging Face cache layout: models--<owner>--<name>/refs/main names the snapshot."""
  commit = "0123456789abcdef0123456789abcdef01234567"
  base = root / f"models--{repo.replace('/', '--')}"
  for name, text in files.items():
    (base / "snapshots" / commit / name).parent.mkdir(parents=True, exist_ok=True)
    (base / "snapshots" / commit / name).write_text(text)
  (base / "refs").mkdir(parents=True, exist_ok=True)
  (base / "refs" / "main").write_text(commit)


def test_a_hub_tokenizer_name_reads_the_cache_offline_and_fails_at_once_when_absent(
    tmp_path, monkeypatch):
  import time

  import huggingface_hub.constants as constants
  monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
  monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
  monkeypatch.setenv("HF_HUB_OFFLINE", "1")
  _hub_cache(tmp_path / "hub", "test-org/chat-model", {
      "tokenizer_config.json": json.dumps({"bos_token": "<s>", "eos_token": "</s>"}),
      "chat_template.jinja": RICH})
  template = chat_files.load_chat_template("hf:test-org/chat-model")
  assert template.source == RICH and dict(template.tokens)["eos_token"] == "</s>"
  start = time.perf_counter()
  with pytest.raises(DataError, match=r"chat template 'hf:test-org/absent': test-org/absent/"
                                      r"tokenizer_config.json is not in the local Hugging Face "
                                      r"cache and offline mode is on"):
    chat_files.load_chat_template("hf:test-org/absent")
  assert time.perf_counter() - start < 5.0


# ----- every field a template reads, through a prepared dataset -----

def _docs(out, source, tok):
  from tests.test_data_hub import _docs as docs
  return docs(out, source, tok)


@pytest.mark.parametrize("kind", ["save_to_disk", "jsonl"])
def test_prepared_conversations_with_fields_and_tools_are_transformers_renderings(
    tmp_path, kind, monkeypatch):
  monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "cache"))
  folder = _saved_tokenizer(tmp_path / "tok", RICH, bos_token="<s>", eos_token="</s>")
  reference = transformers.AutoTokenizer.from_pretrained(str(folder))
  second = [{"role": "user", "content": "Et demain ?"},
            {"role": "assistant", "content": "Pluie.", "reasoning_content": "forecast"}]
  rows = [{"messages": CONVERSATION, "tools": json.dumps(TOOLS)},   # tools as a JSON string
          {"messages": second, "tools": None}]
  if kind == "save_to_disk":
    datasets.Dataset.from_list(rows).save_to_disk(str(tmp_path / "ds"))
    spec = HubSpec(str(tmp_path / "ds"))
  else:
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    spec = HubSpec("json", data_files=(str(tmp_path / "rows.jsonl"),))
  spec = spec._replace(layout="messages", template=str(folder), eval_fraction=0.0)
  tok = load_tokenizer("bytes")
  prepare({"chat": spec}, tok, str(tmp_path / "out"), progress=False)
  want = [reference.apply_chat_template(CONVERSATION, tools=TOOLS, tokenize=False),
          reference.apply_chat_template(second, tokenize=False)]
  assert "<think>forecast</think>Pluie." in want[1]
  assert _docs(tmp_path / "out", "chat", tok) == want
