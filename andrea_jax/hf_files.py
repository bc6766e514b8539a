"""The files beside the weights in a Hugging Face model folder: tokenizer, its configuration with
the chat template, the generation configuration.

A folder ``transformers`` loads with ``AutoTokenizer.from_pretrained(folder)`` encodes exactly as
the run's tokenizer did when it holds:

* ``tokenizer.json``: for a ``tokenizers`` JSON tokenizer (a file, or ``hf:<repo>``'s) that file,
  a saved truncation or padding dropped (this package encodes whole documents); for the built-in
  byte tokenizer (:func:`byte_level_tokenizer_json`) a byte-level BPE without merges whose id for
  the byte ``b`` is ``b``, and ``<|endoftext|>`` at 256. A SentencePiece ``.model`` has no such
  file (:func:`tokenizer_json` gives ``None``): ``transformers``' SentencePiece tokenizers add
  their own start token and spacing rules, so their encodings would differ;
* ``tokenizer_config.json`` (:func:`tokenizer_config`): ``PreTrainedTokenizerFast``, the
  end-of-document token as ``bos_token``, ``eos_token`` and ``pad_token`` (training documents
  start with it: it is the prefix lm-eval conditions on), ``model_max_length = max_len``, no
  clean-up of spaces in ``decode``, and the chat template (:func:`chat_template_source`) when the
  run trained on conversations;
* ``generation_config.json`` (:func:`generation_config`): ``bos/eos/pad_token_id`` = the
  end-of-document id, so ``generate`` stops where a document ends.

One known divergence: text that spells the end-of-document token (``"<|endoftext|>"``) is that
token's id for ``transformers``, while this package's ``encode`` never emits it (a document never
smuggles in a boundary).

Example:
  >>> write_tokenizer_files("out/tiny-hf", load_tokenizer("bytes"), max_len=128)
  ['tokenizer.json', 'tokenizer_config.json', 'generation_config.json']
"""

from __future__ import annotations

import json
import os
from typing import Any

from andrea_jax import storage
from andrea_jax.data.hub.templates import ChatTemplate, template_variables
from andrea_jax.data.tokenizers import BYTE_EOD_ID, EOD_TOKEN, ByteTokenizer, HFTokenizer

# The built-in templates as Jinja, rendering as andrea_jax.data.hub.templates.render_chat does.
CHATML_JINJA = (
    r"{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + "
    r"message['content'] + '<|im_end|>' + '\n' }}{% endfor %}{% if add_generation_prompt %}"
    r"{{ '<|im_start|>assistant\n' }}{% endif %}")
PLAIN_JINJA = (
    r"{% for message in messages %}{% if not loop.first %}{{ '\n\n' }}{% endif %}"
    r"{{ {'system': 'System', 'user': 'User', 'assistant': 'Assistant', 'tool': 'Tool'}"
    r"[message['role']] + ': ' + message['content'] }}{% endfor %}")


def _bytes_to_unicode() -> dict[int, str]:
  """GPT-2's printable stand-in for each byte (what ``tokenizers``' ByteLevel pre-tokenizer maps a
  byte to): printable Latin-1 bytes stand for themselves, the others for ``chr(256 + n)``."""
  keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
          *range(ord("®"), ord("ÿ") + 1)]
  out, n = {b: chr(b) for b in keep}, 0
  for b in range(256):
    if b not in out:
      out[b] = chr(256 + n)
      n += 1
  return out


def byte_level_tokenizer_json() -> str:
  """The built-in byte tokenizer as a ``tokenizers`` JSON: byte ``b`` is id ``b`` (a byte-level
  BPE with the 256 byte symbols and no merge), ``<|endoftext|>`` is the special id 256; decoding
  turns invalid UTF-8 into U+FFFD, as :meth:`ByteTokenizer.decode` does.

  Example:
    >>> tokenizers.Tokenizer.from_str(byte_level_tokenizer_json()).encode("hé").ids
    [104, 195, 169]
  """
  import tokenizers
  from tokenizers import decoders, models, pre_tokenizers

  vocab = {symbol: b for b, symbol in _bytes_to_unicode().items()}
  tok = tokenizers.Tokenizer(models.BPE(vocab=vocab, merges=[]))
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
  tok.decoder = decoders.ByteLevel()
  tok.add_special_tokens([tokenizers.AddedToken(EOD_TOKEN, special=True, normalized=False)])
  assert tok.token_to_id(EOD_TOKEN) == BYTE_EOD_ID
  return tok.to_str(pretty=True)


def tokenizer_json(tokenizer) -> str | None:
  """The ``tokenizer.json`` text that encodes as ``tokenizer`` does, or ``None`` for a tokenizer
  that has none (SentencePiece). A ``tokenizers`` file is copied, less any saved truncation or
  padding."""
  if isinstance(tokenizer, ByteTokenizer):
    return byte_level_tokenizer_json()
  if not isinstance(tokenizer, HFTokenizer):
    return None
  with open(tokenizer.spec, encoding="utf-8") as f:
    text = f.read()
  saved = json.loads(text)
  if saved.get("truncation") is None and saved.get("padding") is None:
    return text
  import tokenizers
  tok = tokenizers.Tokenizer.from_str(text)
  tok.no_truncation()
  tok.no_padding()
  return tok.to_str(pretty=True)


def eod_token(tokenizer) -> str:
  """The text of the end-of-document token (``<|endoftext|>`` for the byte tokenizer)."""
  return getattr(tokenizer, "eod_token", EOD_TOKEN)


def chat_template_source(template: ChatTemplate) -> str:
  """The Jinja text ``transformers``' ``apply_chat_template`` renders as :func:`render_chat`
  renders ``template``: the built-in ``chatml`` and ``plain`` written in Jinja; a Jinja template
  as it is, the special tokens it reads (``bos_token``, ``eos_token``, ...) set at its top to the
  values the run rendered with (the exported tokenizer's own are the end-of-document token).

  Example:
    >>> chat_template_source(CHATML) == CHATML_JINJA
    True
  """
  if template.name == "chatml":
    return CHATML_JINJA
  if template.name == "plain":
    return PLAIN_JINJA
  read = template_variables(template.source)
  sets = "".join(f"{{% set {name} = {json.dumps(value)} %}}" for name, value in template.tokens
                 if name in read)
  return sets + template.source


def tokenizer_config(tokenizer, max_len: int, template: ChatTemplate | None = None
                     ) -> dict[str, Any]:
  """``tokenizer_config.json``: the fast tokenizer class, the end-of-document token as BOS, EOS
  and padding, ``model_max_length``, no space clean-up, and the chat template when given."""
  eod = eod_token(tokenizer)
  config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": eod, "eos_token": eod,
            "pad_token": eod, "model_max_length": int(max_len),
            "clean_up_tokenization_spaces": False, "add_bos_token": False,
            "add_eos_token": False}
  if template is not None:
    config["chat_template"] = chat_template_source(template)
  return config


def generation_config(eod_id: int) -> dict[str, Any]:
  """``generation_config.json``: generation starts after, stops at and pads with the
  end-of-document id."""
  return {"bos_token_id": int(eod_id), "eos_token_id": int(eod_id), "pad_token_id": int(eod_id)}


def write_tokenizer_files(folder: str, tokenizer, max_len: int,
                          template: ChatTemplate | None = None) -> list[str]:
  """Writes ``tokenizer.json`` and ``tokenizer_config.json`` (when the tokenizer has a
  ``tokenizer.json``: :func:`tokenizer_json`) and ``generation_config.json`` into ``folder``;
  returns the names written."""
  written = []
  text = tokenizer_json(tokenizer)
  files = {"generation_config.json": json.dumps(generation_config(tokenizer.eod_id), indent=2)}
  if text is not None:
    config = json.dumps(tokenizer_config(tokenizer, max_len, template), indent=2,
                        ensure_ascii=False)
    files = {"tokenizer.json": text, "tokenizer_config.json": config, **files}
  for name, content in files.items():
    storage.atomic_write(os.path.join(folder, name), content, f"{name} was not written")
    written.append(name)
  return written
