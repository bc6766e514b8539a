"""chat: message shapes, OpenAssistant threads, templates (against transformers), marker tokens."""

import json

import numpy as np
import pytest

from andrea_jax.data import DataError, chat, chat_files, train_bpe
from andrea_jax.data import chat_templates as ct

CHATML_JINJA = (  # the ChatML template of many tokenizer configurations (e.g. Hermes 3, SmolLM2)
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] "
    "+ '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}")
ZEPHYR_JINJA = """{% for message in messages %}
{% if message['role'] == 'user' %}
{{ '<|user|>\n' + message['content'] + eos_token }}
{% elif message['role'] == 'system' %}
{{ '<|system|>\n' + message['content'] + eos_token }}
{% elif message['role'] == 'assistant' %}
{{ '<|assistant|>\n'  + message['content'] + eos_token }}
{% endif %}
{% if loop.last and add_generation_prompt %}
{{ '<|assistant|>' }}
{% endif %}
{% endfor %}"""
ALTERNATING_JINJA = (  # Llama 2 style: bos_token, raise_exception on roles out of turn
    "{{ bos_token }}{% for message in messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
    "{% endif %}{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] | trim + "
    "' [/INST]' }}{% else %}{{ ' ' + message['content'] | trim + ' ' + eos_token }}{% endif %}"
    "{% endfor %}")
CONVERSATION = [{"role": "system", "content": "Be brief."},
                {"role": "user", "content": "Hi  there\n"},
                {"role": "assistant", "content": "Hello! {{ not jinja }} <b>x</b> \"q\""}]


def test_role_content_and_from_value_shapes_normalise_alike():
  openai = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Yo"}]
  sharegpt = [{"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Yo", "weight": 1.0}]
  want = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Yo"}]
  assert chat.normalize_messages(openai) == want
  # Fields other than the role and the content are passed on, as apply_chat_template does.
  assert chat.normalize_messages(sharegpt) == [want[0], {**want[1], "weight": 1.0}]
  # Arrow fills the other shape's keys with None: still the same conversation.
  mixed = [{"role": None, "content": None, "from": "human", "value": "Hi"},
           {"role": "assistant", "content": "Yo", "from": None, "value": None}]
  assert chat.normalize_messages(mixed) == want
  assert chat.normalize_messages(openai, system="S")[0] == {"role": "system", "content": "S"}
  assert chat.normalize_messages(openai, system="") == want


@pytest.mark.parametrize("messages, match", [
    ([], "empty conversation"),
    ([{"content": "x"}], r"message 0 has no role \(no 'role' or 'from'; keys \['content'\]\)"),
    ([{"role": "user", "content": "a"}, {"role": "robot", "content": "b"}],
     "message 1 has the unknown role 'robot'"),
    ([{"role": "user", "content": None}], r"message 0 \(user\) has content of type NoneType"),
    ([{"role": "user", "content": [{"type": "text", "text": "a"}]}],
     r"message 0 \(user\) has content of type list"),
    ("hello", "the messages are a str, not a list"),
])
def test_bad_conversations_say_what_is_wrong(messages, match):
  with pytest.raises(chat.ConversationError, match=match):
    chat.normalize_messages(messages)


def test_tree_threads_are_every_root_to_leaf_path_in_leaf_order():
  # Two trees, rows shuffled: tree 1 = a -> (b -> d, c); tree 2 = x -> y.
  n = chat.TreeNode
  nodes = [n("b", "a", "assistant", "B"), n("x", None, "user", "X"), n("a", None, "user", "A"),
           n("d", "b", "user", "D"), n("c", "a", "assistant", "C"), n("y", "x", "assistant", "Y")]
  # Leaves in row order: d (3), c (4), y (5).
  assert chat.tree_threads(nodes) == [[2, 0, 3], [2, 4], [1, 5]]


def test_tree_errors_name_the_node():
  n = chat.TreeNode
  with pytest.raises(chat.TreeError, match="answers parent 'zz', which is not in the split") as e:
    chat.tree_threads([n("a", None, "user", "A"), n("b", "zz", "assistant", "B")])
  assert e.value.index == 1
  with pytest.raises(chat.TreeError, match="repeats the id") as e:
    chat.tree_threads([n("a", None, "user", "A"), n("a", None, "user", "B")])
  assert e.value.index == 1
  with pytest.raises(chat.ConversationError, match="unknown role 'moderator'"):
    chat.tree_node({"message_id": "m", "parent_id": None, "role": "moderator", "text": "t"})


def test_builtin_templates_by_hand():
  msgs = chat.normalize_messages(CONVERSATION)
  assert ct.render_chat(ct.CHATML, msgs) == (
      "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi  there\n<|im_end|>\n"
      "<|im_start|>assistant\nHello! {{ not jinja }} <b>x</b> \"q\"<|im_end|>\n")
  assert ct.render_chat(ct.PLAIN, msgs) == (
      "System: Be brief.\n\nUser: Hi  there\n\n\nAssistant: Hello! {{ not jinja }} <b>x</b> \"q\"")


def _hf_tokenizer_dir(tmp_path, template, **special):
  """A local transformers tokenizer directory: a small BPE plus a tokenizer_config.json."""
  train_bpe(["hello world " * 20], 300, tmp_path / "tokenizer.json")
  config = {"tokenizer_class": "PreTrainedTokenizerFast", "chat_template": template, **special}
  (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
  return tmp_path


@pytest.mark.parametrize("template, special", [
    (CHATML_JINJA, {}),
    (ZEPHYR_JINJA, {"eos_token": "</s>"}),
    (ALTERNATING_JINJA, {"bos_token": "<s>", "eos_token": "</s>"}),
])
def test_jinja_template_renders_as_transformers_apply_chat_template(tmp_path, template, special):
  transformers = pytest.importorskip("transformers")
  directory = _hf_tokenizer_dir(tmp_path, template, **special)
  tmpl = chat_files.load_chat_template(str(directory / "tokenizer_config.json"))
  assert tmpl.name.startswith("jinja:")
  reference = transformers.AutoTokenizer.from_pretrained(str(directory))
  for messages in (CONVERSATION[1:], [CONVERSATION[1], CONVERSATION[2]] * 3):
    want = reference.apply_chat_template(messages, tokenize=False, add_generation_prompt=False)
    assert ct.render_chat(tmpl, chat.normalize_messages(messages)) == want
  # The built-in ChatML is the same text as the Jinja ChatML template.
  if template == CHATML_JINJA:
    assert ct.render_chat(ct.CHATML, CONVERSATION) == reference.apply_chat_template(
        CONVERSATION, tokenize=False)


def test_jinja_raise_exception_is_a_conversation_error(tmp_path):
  directory = _hf_tokenizer_dir(tmp_path, ALTERNATING_JINJA, bos_token="<s>", eos_token="</s>")
  tmpl = chat_files.load_chat_template(str(directory))
  with pytest.raises(chat.ConversationError, match="roles must alternate"):
    ct.render_chat(tmpl, [{"role": "assistant", "content": "first"}])


def test_named_templates_and_markers_from_the_configuration(tmp_path):
  config = {"chat_template": [{"name": "default", "template": ZEPHYR_JINJA},
                              {"name": "tool_use", "template": CHATML_JINJA}],
            "eos_token": {"content": "</s>", "special": True},
            "added_tokens_decoder": {str(i): {"content": t, "special": True} for i, t in
                                     enumerate(["<|user|>", "<|assistant|>", "<|system|>",
                                                "<|unused|>", "\n"])}}
  path = tmp_path / "tokenizer_config.json"
  path.write_text(json.dumps(config))
  default = chat_files.load_chat_template(str(path))
  # The added tokens the template writes, and eos_token (named in it); not <|unused|> nor "\n".
  assert default.markers == ("</s>", "<|assistant|>", "<|system|>", "<|user|>")
  assert default.tokens == (("eos_token", "</s>"),)
  tool = chat_files.load_chat_template(f"{path}::tool_use")
  assert tool.source == CHATML_JINJA and tool.fingerprint != default.fingerprint
  with pytest.raises(DataError, match=r"no chat template named 'nope' \(has \['default', "):
    chat_files.load_chat_template(f"{path}::nope")
  with pytest.raises(DataError, match="neither 'chatml', 'plain'"):
    chat_files.load_chat_template(str(tmp_path / "missing.json"))


def test_markers_become_single_ids_of_a_bpe_tokenizer(tmp_path):
  bpe = train_bpe(["hello world, how are you? " * 20], 320, tmp_path / "bpe.json")
  with pytest.raises(DataError, match=r"splits the chat marker '<\|im_start\|>' .* into \d+ "
                     r"ids.*add_chat_tokens"):
    ct.check_chat_tokens(bpe, ct.CHATML)
  tok = ct.add_chat_tokens(tmp_path / "bpe.json", ct.CHATML_MARKERS, tmp_path / "chat.json")
  ct.check_chat_tokens(tok, ct.CHATML)
  assert tok.vocab_size == bpe.vocab_size + 2
  start, end = (int(tok.encode(m)[0]) for m in ct.CHATML_MARKERS)
  assert {start, end} == {bpe.vocab_size, bpe.vocab_size + 1}
  text = ct.render_chat(ct.CHATML, chat.normalize_messages(CONVERSATION))
  ids = tok.encode(text)
  assert int((ids == start).sum()) == text.count("<|im_start|>") == 3
  assert int((ids == end).sum()) == text.count("<|im_end|>") == 3
  assert tok.decode(ids) == text
  # The end-of-document token is left special: text spelling it is still never the boundary id.
  assert tok.eod_id not in tok.encode("a<|endoftext|>b").tolist()
  # A marker already in the vocabulary keeps its id (made non-special).
  again = ct.add_chat_tokens(tmp_path / "chat.json", ct.CHATML_MARKERS, tmp_path / "again.json")
  assert again.vocab_size == tok.vocab_size and int(again.encode("<|im_end|>")[0]) == end
  assert np.array_equal(again.encode(text), ids)


def test_a_closed_loop_of_parents_is_refused_naming_every_message_of_it():
  n = chat.TreeNode
  # x <-> y answer each other (no root); z answers y; a real tree a -> b beside them.
  nodes = [n("a", None, "user", "A"), n("y", "x", "assistant", "Y"), n("b", "a", "assistant", "B"),
           n("x", "y", "user", "X"), n("z", "y", "user", "Z")]
  with pytest.raises(chat.TreeError, match=r"messages \['y', 'x'\] answer one another in a "
                                           r"closed loop") as e:
    chat.tree_threads(nodes)
  assert e.value.index == 1   # the loop's first message in row order
  # A message that answers itself is a loop of one.
  with pytest.raises(chat.TreeError, match=r"messages \['s'\] answer one another"):
    chat.tree_threads([n("s", "s", "user", "S")])
  # Long chains are walked once each, not once per leaf: 20000 messages, one thread.
  chain = [n("m0", None, "user", "0")] + [n(f"m{i}", f"m{i - 1}", "user", str(i))
                                          for i in range(1, 20000)]
  assert [len(t) for t in chat.tree_threads(chain)] == [20000]
