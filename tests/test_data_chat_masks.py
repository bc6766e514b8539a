"""chat_masks: the spans ``loss_on`` counts, by hand and against transformers'
``apply_chat_template(..., return_assistant_tokens_mask=True)``, and token masks from offsets."""

import numpy as np
import pytest

from andrea_jax.data import DataError, chat, load_tokenizer, train_bpe
from andrea_jax.data import chat_masks as cm
from andrea_jax.data import chat_templates as ct
from andrea_jax.data.tokenizers import SentencePieceTokenizer

CONVERSATIONS = [
    [{"role": "system", "content": "Sois bref."},
     {"role": "user", "content": "Ça va ? 你好"},
     {"role": "assistant", "content": "Très bien 🙂"},
     {"role": "user", "content": ""},
     {"role": "assistant", "content": ""},
     {"role": "user", "content": "world"},
     {"role": "assistant", "content": "hello world\n\nbye"}],
    [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "world"}],
]
CHATML_JINJA = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] "
    "+ '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}")
# ChatML with the assistant's text and its end-of-turn marker in {% generation %} blocks, as TRL's
# training templates mark them.
CHATML_GENERATION = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' }}"
    "{% if message['role'] == 'assistant' %}{% generation %}{{ message['content'] + '<|im_end|>' }}"
    "{% endgeneration %}{% else %}{{ message['content'] + '<|im_end|>' }}{% endif %}{{ '\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")


def _spans_text(text, spans):
  return [text[a:b] for a, b in spans]


def test_chatml_and_plain_assistant_turns_by_hand():
  text, spans = cm.loss_spans(ct.CHATML, CONVERSATIONS[0], "assistant")
  assert text == ct.render_chat(ct.CHATML, CONVERSATIONS[0])
  # The turn's text and its end-of-turn marker; the header and the line break after, not.
  assert _spans_text(text, spans) == ["Très bien 🙂<|im_end|>", "<|im_end|>",
                                      "hello world\n\nbye<|im_end|>"]
  text, spans = cm.loss_spans(ct.PLAIN, CONVERSATIONS[0], "assistant")
  assert _spans_text(text, spans) == ["Très bien 🙂", "hello world\n\nbye"]   # the empty turn: none


def test_a_jinja_template_s_turns_are_what_each_assistant_message_adds_to_its_header():
  jinja = ct.ChatTemplate("jinja:chatml", CHATML_JINJA)
  for messages in CONVERSATIONS:
    # The same spans as the built-in ChatML, found from the template alone.
    assert cm.loss_spans(jinja, messages, "assistant") == cm.loss_spans(ct.CHATML, messages,
                                                                          "assistant")
  # Zephyr's header is '<|assistant|>\n' but its generation prompt '<|assistant|>': the line break
  # is the assistant's first token (a model must write it), the eos the last.
  zephyr = ct.ChatTemplate("jinja:zephyr", (
      "{% for m in messages %}{{ '<|' + m['role'] + '|>\n' + m['content'] + eos_token + '\n' }}"
      "{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"),
      (("eos_token", "</s>"),))
  text, spans = cm.loss_spans(zephyr, CONVERSATIONS[1], "assistant")
  assert _spans_text(text, spans) == ["\nworld</s>"]


def test_a_template_that_rewrites_earlier_turns_is_refused_for_assistant_and_fine_for_generation():
  # Only the last assistant turn keeps its reasoning (as Qwen3's template does).
  rewriting = ct.ChatTemplate("jinja:qwen-like", (
      "{% for m in messages %}<|{{ m.role }}|>{% if m.role == 'assistant' %}{% generation %}"
      "{% if loop.last %}<think>r</think>{% endif %}{{ m.content }}<|end|>{% endgeneration %}"
      "{% else %}{{ m.content }}<|end|>{% endif %}{% endfor %}"
      "{% if add_generation_prompt %}<|assistant|>{% endif %}"))
  messages = CONVERSATIONS[0][1:4] + [{"role": "assistant", "content": "fin"}]
  with pytest.raises(chat.ConversationError, match=r"does not render message 1 \(assistant\) as a "
                                                   r"continuation .* loss_on='generation'"):
    cm.loss_spans(rewriting, messages, "assistant")
  text, spans = cm.loss_spans(rewriting, messages, "generation")
  assert _spans_text(text, spans) == ["Très bien 🙂<|end|>", "<think>r</think>fin<|end|>"]


def test_loss_on_is_checked_against_the_layout_and_the_template():
  cm.check_loss_on("all", None, "source 'books'")
  with pytest.raises(DataError, match=r"source 'chat': loss_on must be one of \('all', "
                                      r"'assistant', 'generation'\), got 'assistants'"):
    cm.check_loss_on("assistants", ct.CHATML, "source 'chat'")
  with pytest.raises(DataError, match="source 'books': loss_on 'assistant' needs conversations"):
    cm.check_loss_on("assistant", None, "source 'books'")
  with pytest.raises(DataError, match=r"loss_on 'generation' needs a Jinja chat template with "
                                      r"\{% generation %\} blocks; chatml has none"):
    cm.check_loss_on("generation", ct.CHATML, "source 'chat'")
  cm.check_loss_on("generation", ct.ChatTemplate("jinja:g", CHATML_GENERATION), "source 'chat'")


def test_token_mask_marks_every_token_that_overlaps_a_span():
  offsets = np.array([[0, 2], [2, 5], [5, 6], [6, 9], [9, 9], [9, 12]])
  # Span [3, 6): token [2, 5) starts before it but overlaps it; [5, 6) inside; [6, 9) after.
  assert cm.token_mask(offsets, [(3, 6)]).tolist() == [False, True, True, False, False, False]
  # Two spans; [9, 9) (an empty token at 9) is outside [9, 12)'s start, as in transformers.
  assert cm.token_mask(offsets, [(0, 1), (10, 12)]).tolist() == [True, False, False, False,
                                                                  False, True]
  assert cm.token_mask(offsets, []).tolist() == [False] * 6


def test_byte_masks_cover_the_bytes_of_the_counted_characters():
  text, spans = cm.loss_spans(ct.CHATML, CONVERSATIONS[0], "assistant")
  (ids, mask), = cm.encode_masked(load_tokenizer("bytes"), [(text, spans)])
  counted = bytes(ids[mask].astype(np.uint8).tolist()).decode()
  assert counted == "Très bien 🙂<|im_end|><|im_end|>hello world\n\nbye<|im_end|>"
  assert int(mask.sum()) == len("Très bien 🙂".encode()) + len("hello world\n\nbye") + 3 * 10


def test_sentencepiece_masks_cover_the_counted_characters(tmp_path):
  spm = pytest.importorskip("sentencepiece")
  spm.SentencePieceTrainer.train(
      sentence_iterator=iter(["hello world Très bien 🙂 bye <|im_end|>"] * 100),
      model_prefix=str(tmp_path / "sp"), vocab_size=40, model_type="bpe", eos_id=1, bos_id=-1,
      pad_id=-1, unk_id=0, minloglevel=2)
  tok = SentencePieceTokenizer(tmp_path / "sp.model")
  messages = CONVERSATIONS[1]
  text, spans = cm.loss_spans(ct.CHATML, messages, "assistant")
  (ids, mask), = cm.encode_masked(tok, [(text, spans)])
  assert ids.tolist() == tok.encode(text).tolist()
  # The counted pieces decode to the span's text (SentencePiece decodes a run of pieces whole).
  first, last = np.flatnonzero(mask)[[0, -1]]
  assert mask[first:last + 1].all()
  assert tok.decode(ids[first:last + 1]).strip() == "world<|im_end|>"


def _bpe_folder(tmp_path, template):
  """A transformers tokenizer folder: a BPE with the ChatML markers as added (non-special)
  tokens, and ``template``."""
  transformers = pytest.importorskip("transformers")
  train_bpe([" ".join(m["content"] for c in CONVERSATIONS for m in c) * 5], 400,
            tmp_path / "base.json")
  ct.add_chat_tokens(tmp_path / "base.json", ct.CHATML_MARKERS, tmp_path / "tokenizer.json")
  tok = transformers.PreTrainedTokenizerFast(tokenizer_file=str(tmp_path / "tokenizer.json"))
  tok.chat_template = template
  tok.save_pretrained(str(tmp_path / "tok"))
  return tok, load_tokenizer(tmp_path / "tokenizer.json")


@pytest.mark.parametrize("template, loss_on", [
    (ct.CHATML, "assistant"),
    (ct.ChatTemplate("jinja:chatml", CHATML_JINJA), "assistant"),
    (ct.ChatTemplate("jinja:chatml-generation", CHATML_GENERATION), "generation"),
])
def test_masks_equal_transformers_assistant_masks(tmp_path, template, loss_on):
  reference, tok = _bpe_folder(tmp_path, CHATML_GENERATION)
  for messages in CONVERSATIONS:
    want = reference.apply_chat_template(messages, tokenize=True, return_dict=True,
                                         return_assistant_tokens_mask=True)
    text, spans = cm.loss_spans(template, messages, loss_on)
    (ids, mask), = cm.encode_masked(tok, [(text, spans)])
    assert ids.tolist() == list(want["input_ids"])
    assert mask.astype(int).tolist() == list(want["assistant_masks"])
    assert 0 < mask.sum() < mask.size
