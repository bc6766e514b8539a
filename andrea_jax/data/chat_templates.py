"""Chat templates: how a conversation (:mod:`andrea_jax.data.chat`) becomes one document's text.

* :func:`render_chat` with a :class:`ChatTemplate`
  (:func:`andrea_jax.data.chat_files.load_chat_template`): ``"chatml"``
  (the default: ``<|im_start|>{role}\n{content}<|im_end|>\n`` per message), ``"plain"``
  (``User: ...``, ``Assistant: ...`` paragraphs), or a Jinja chat template, rendered as
  ``transformers``' ``apply_chat_template`` does: sandboxed Jinja with ``trim_blocks`` /
  ``lstrip_blocks``; ``messages`` with every field of each message (a reasoning under
  ``reasoning_content`` and ``thinking`` alike); ``tools``, a row's tool schemas (then the
  tokenizer's ``tool_use`` template, when it has one and no template was named); the special
  tokens ``bos_token``, ``eos_token``, ... of the tokenizer's configuration;
  ``add_generation_prompt=False``, ``raise_exception``, ``tojson``. ``strftime_now`` is left
  undefined, so a template that prints today's date uses its own fixed default and the prepared
  data stays the same from day to day.
  Where a Jinja template is read from (a tokenizer folder, a template file, the Hub) is
  :mod:`andrea_jax.data.chat_files`.
* :func:`render_generation_spans` -- the text with the character spans of the template's
  ``{% generation %}`` blocks, as ``return_assistant_tokens_mask`` finds them.
* :func:`check_chat_tokens`, :func:`add_chat_tokens` -- with a BPE tokenizer each marker of the
  template (``<|im_start|>``, ``<|im_end|>``, ...) must be one id, never split into pieces.
  Markers are kept as *added, non-special* tokens: this pipeline encodes special tokens spelled
  in text as ordinary text (so that no document can spell an end-of-document boundary), while an
  added non-special token is matched as one id. The end-of-document token itself stays special;
  a template that writes it (``eos_token`` after each turn) spells it as text.
"""

from __future__ import annotations

import contextvars
import functools
import hashlib
import json
import os
import re
from collections.abc import Sequence
from typing import Any, NamedTuple

from andrea_jax.data.chat import ConversationError, Message
from andrea_jax.data.errors import DataError
from andrea_jax.data.tokenizers import HFTokenizer, Tokenizer

CHATML_MARKERS = ("<|im_start|>", "<|im_end|>")
PLAIN_LABELS = {"system": "System", "user": "User", "assistant": "Assistant", "tool": "Tool"}
# The special tokens transformers passes to a chat template (its tokenizer's special_tokens_map).
TEMPLATE_TOKENS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token",
                   "mask_token")
_GENERATION_TAG = re.compile(r"\{%-?\s*generation\s*-?%\}")   # transformers' test for the tag
# Names a message's reasoning comes under; a template reads the first (and gpt-oss's `thinking`).
_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")
# While render_generation_spans runs: (the text rendered so far, in blocks; the spans found).
_TRACKER: contextvars.ContextVar = contextvars.ContextVar("generation_spans", default=None)


class ChatTemplate(NamedTuple):
  """How conversations become text (see :func:`andrea_jax.data.chat_files.load_chat_template`).

  Attributes:
    name: ``"chatml"``, ``"plain"`` or ``"jinja:<where it came from>"``.
    source: the Jinja text (``""`` for the built-in templates).
    tokens: ``(name, text)`` of the special tokens the Jinja template sees (``bos_token``, ...).
    markers: the template's own tokens that a BPE tokenizer must keep as single ids.
    tool_source: the tokenizer's ``tool_use`` template, rendered instead for a row with tools
      (``""``: none, or a template was named).
  """
  name: str
  source: str = ""
  tokens: tuple[tuple[str, str], ...] = ()
  markers: tuple[str, ...] = ()
  tool_source: str = ""

  @property
  def fingerprint(self) -> str:
    """SHA-256 of what decides the rendering (not where it came from)."""
    kind = self.name.split(":")[0]
    key = json.dumps([kind, self.source, list(self.tokens)]
                     + ([self.tool_source] if self.tool_source else []), ensure_ascii=True)
    return hashlib.sha256(key.encode("utf-8")).hexdigest()

  @property
  def marks_generation(self) -> bool:
    """Whether the template marks the assistant's text with ``{% generation %}`` blocks."""
    return bool(_GENERATION_TAG.search(self.source)) and (
        not self.tool_source or bool(_GENERATION_TAG.search(self.tool_source)))


CHATML = ChatTemplate("chatml", markers=CHATML_MARKERS)
PLAIN = ChatTemplate("plain")


def template_variables(source: str) -> frozenset[str]:
  """The variables a Jinja template reads that it does not set itself (``messages``,
  ``eos_token``, ...), as ``jinja2.meta`` finds them.

  Example:
    >>> sorted(template_variables("{{ bos_token }}{% for m in messages %}{{ m.content }}{% endfor %}"))
    ['bos_token', 'messages']
  """
  import jinja2.meta
  return frozenset(jinja2.meta.find_undeclared_variables(_compiled(source).environment.parse(
      source)))


@functools.lru_cache(maxsize=8)
def _compiled(source: str):
  try:
    import jinja2
    from jinja2.ext import Extension, loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment
  except ImportError as e:
    raise ImportError("Jinja chat templates need jinja2: pip install 'andrea_jax[hub]'") from e
  if tuple(int(x) for x in re.findall(r"\d+", jinja2.__version__)[:3]) < (3, 1, 6):
    # Older versions have known sandbox escapes; a chat template from the Hub is untrusted code.
    raise ImportError(f"Jinja chat templates need jinja2 >= 3.1.6, found {jinja2.__version__}: "
                      "pip install 'andrea_jax[hub]'")

  class Generation(Extension):
    """``{% generation %}...{% endgeneration %}`` marks assistant text: rendered as is, its span
    recorded while :func:`render_generation_spans` runs (where the text so far ends, as
    transformers' AssistantTracker measures it)."""
    tags = {"generation"}

    def parse(self, parser):
      lineno = next(parser.stream).lineno
      body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
      return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller):
      text = caller()
      tracking = _TRACKER.get()
      if tracking is not None:
        blocks, spans = tracking
        start = sum(map(len, blocks))
        spans.append((start, start + len(text)))
      return text

  def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)

  def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    # As transformers: JSON without Jinja's HTML escaping.
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)

  env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                      extensions=[Generation, loopcontrols])
  env.filters["tojson"] = tojson
  env.globals["raise_exception"] = raise_exception
  try:
    return env.from_string(source)
  except jinja2.TemplateSyntaxError as e:
    raise DataError(f"chat template: Jinja syntax error at line {e.lineno}: {e.message}") from e


def _with_reasoning_aliases(messages: Sequence[Message]) -> list[Message]:
  """Each message as a fresh dict, a reasoning given under any of its names also under
  ``thinking`` and ``reasoning_content``, as ``transformers`` passes it."""
  out = []
  for m in messages:
    reasoning = next((m[k] for k in _REASONING_FIELDS if m.get(k) is not None), None)
    out.append({"thinking": reasoning, **m, "reasoning_content": reasoning}
               if reasoning is not None else dict(m))
  return out


def _content_of(message: Message, template: str) -> str:
  if "content" not in message:
    raise ConversationError(f"a {message['role']} message has no content (only "
                            f"{sorted(k for k in message if k != 'role')}); the built-in "
                            f"template {template!r} renders content alone: use a Jinja template "
                            "that reads those fields")
  return message["content"]


def render_chat(template: ChatTemplate, messages: Sequence[Message], tools: Any = None, *,
                add_generation_prompt: bool = False) -> str:
  """The text of a conversation (``messages`` from :func:`normalize_messages`).

  * ChatML: ``"".join(f"<|im_start|>{role}\\n{content}<|im_end|>\\n")``, then
    ``"<|im_start|>assistant\\n"`` with ``add_generation_prompt``;
  * plain: ``"\\n\\n".join(f"{Role}: {content}")``, Role one of ``System``, ``User``,
    ``Assistant``, ``Tool`` (``add_generation_prompt`` adds nothing);
  * Jinja: ``template.render(messages=..., tools=tools, documents=None,
    add_generation_prompt=add_generation_prompt, **special tokens)``, the ``tool_use`` template
    for a conversation with tools when the tokenizer has one. The built-in templates ignore
    ``tools``.

  Raises:
    ConversationError: the Jinja template raised (``raise_exception``, e.g. roles that do not
      alternate) or failed; a built-in template met a message without content.

  Example:
    >>> render_chat(CHATML, [{"role": "user", "content": "Hi"}])
    '<|im_start|>user\\nHi<|im_end|>\\n'
  """
  if template.name == "chatml":
    text = "".join(f"<|im_start|>{m['role']}\n{_content_of(m, 'chatml')}<|im_end|>\n"
                   for m in messages)
    return text + ("<|im_start|>assistant\n" if add_generation_prompt else "")
  if template.name == "plain":
    return "\n\n".join(f"{PLAIN_LABELS[m['role']]}: {_content_of(m, 'plain')}" for m in messages)
  return _render_jinja(template, messages, tools, add_generation_prompt, None)


def render_generation_spans(template: ChatTemplate, messages: Sequence[Message],
                            tools: Any = None) -> tuple[str, list[tuple[int, int]]]:
  """``(text, spans)``: :func:`render_chat`'s text and the ``[start, end)`` character span of
  each ``{% generation %}`` block in it, in order, as ``transformers``' ``apply_chat_template(...,
  return_assistant_tokens_mask=True)`` records them (a block's start is the length of the text
  rendered before it).

  Example:
    >>> t = ChatTemplate("jinja:x", "{% for m in messages %}{{ m.role }}: {% if m.role == "
    ...     "'assistant' %}{% generation %}{{ m.content }}{% endgeneration %}{% else %}"
    ...     "{{ m.content }}{% endif %}\\n{% endfor %}")
    >>> render_generation_spans(t, [{"role": "user", "content": "Hi"},
    ...                             {"role": "assistant", "content": "Yo"}])
    ('user: Hi\\nassistant: Yo\\n', [(20, 22)])
  """
  spans: list[tuple[int, int]] = []
  return _render_jinja(template, messages, tools, False, spans), spans


def _render_jinja(template: ChatTemplate, messages: Sequence[Message], tools: Any,
                  add_generation_prompt: bool, spans: list | None) -> str:
  source = template.tool_source if tools is not None and template.tool_source else template.source
  compiled = _compiled(source)
  kwargs = dict(messages=_with_reasoning_aliases(messages), tools=tools, documents=None,
                add_generation_prompt=add_generation_prompt, **dict(template.tokens))
  try:
    if spans is None:
      return compiled.render(**kwargs)
    blocks: list[str] = []
    token = _TRACKER.set((blocks, spans))
    try:
      for block in compiled.generate(**kwargs):
        blocks.append(block)
    finally:
      _TRACKER.reset(token)
    return "".join(blocks)
  except Exception as e:  # TemplateError from raise_exception, or any error inside the template
    raise ConversationError(f"the chat template {template.name} failed: {type(e).__name__}: "
                            f"{e}") from e


def check_chat_tokens(tokenizer: Tokenizer, template: ChatTemplate) -> None:
  """``DataError`` unless every marker of ``template`` encodes to one id with ``tokenizer``.

  The byte tokenizer has no multi-byte ids and is not checked; the end-of-document token (which a
  template may write as ``eos_token``) is meant to be spelled as text and is not checked either.
  """
  if tokenizer.name == "bytes":
    return
  eod = getattr(tokenizer, "eod_token", None)
  for marker in template.markers:
    ids = tokenizer.encode(marker)
    if len(ids) != 1 and marker != eod:
      raise DataError(
          f"tokenizer {tokenizer.name} splits the chat marker {marker!r} of template "
          f"{template.name} into {len(ids)} ids; add the template's markers to it as single "
          "tokens: andrea_jax.data.chat_templates.add_chat_tokens(tokenizer_json, "
          f"{list(template.markers)}, out_json), and use out_json as the tokenizer")


def add_chat_tokens(path: str | os.PathLike, markers: Sequence[str],
                    out_path: str | os.PathLike) -> HFTokenizer:
  """A copy of a ``tokenizers`` JSON file in which each marker is one added, non-special token.

  A marker the vocabulary lacks gets the next free id (the vocabulary grows by one); one that is
  already an added token keeps its id and is made non-special (this pipeline encodes special
  tokens spelled in text as text). The end-of-document token is left as it is.

  Example:
    >>> tok = add_chat_tokens("bpe.json", CHATML_MARKERS, "bpe_chat.json")   # doctest: +SKIP
    >>> len(tok.encode("<|im_start|>"))   # doctest: +SKIP
    1
  """
  import tokenizers

  base = HFTokenizer(path)
  tok = tokenizers.Tokenizer.from_file(os.fspath(path))
  new = [tokenizers.AddedToken(m, special=False, normalized=False) for m in markers
         if m and m != base.eod_token]
  tok.add_tokens(new)
  out_path = os.fspath(out_path)
  os.makedirs(os.path.dirname(os.path.abspath(out_path)), exist_ok=True)
  tmp = f"{out_path}.tmp{os.getpid()}"
  tok.save(tmp)
  os.replace(tmp, out_path)
  # The library matches the new tokens only once the file is read again (checked in the tests).
  return HFTokenizer(out_path)
