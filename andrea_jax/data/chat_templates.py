"""Chat templates: how a conversation (:mod:`andrea_jax.data.chat`) becomes one document's text.

* :func:`render_chat` with a :class:`ChatTemplate` from :func:`load_chat_template`: ``"chatml"``
  (the default: ``<|im_start|>{role}\\n{content}<|im_end|>\\n`` per message), ``"plain"``
  (``User: ...``, ``Assistant: ...`` paragraphs), or the Jinja ``chat_template`` of a tokenizer's
  configuration, rendered as ``transformers``' ``apply_chat_template`` does (sandboxed Jinja with
  ``trim_blocks``/``lstrip_blocks``, ``messages``, the special tokens ``bos_token``, ``eos_token``,
  ..., ``add_generation_prompt=False``, ``raise_exception``, ``tojson``). ``strftime_now`` is
  left undefined, so a template that prints today's date uses its own fixed default and the
  prepared data stays the same from day to day.
* :func:`check_chat_tokens`, :func:`add_chat_tokens` -- with a BPE tokenizer each marker of the
  template (``<|im_start|>``, ``<|im_end|>``, ...) must be one id, never split into pieces.
  Markers are kept as *added, non-special* tokens: this pipeline encodes special tokens spelled
  in text as ordinary text (so that no document can spell an end-of-document boundary), while an
  added non-special token is matched as one id. The end-of-document token itself stays special;
  a template that writes it (``eos_token`` after each turn) spells it as text.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from andrea_jax.data.chat import ConversationError, Message
from andrea_jax.data.errors import DataError
from andrea_jax.data.tokenizers import HFTokenizer, Tokenizer

CHATML_MARKERS = ("<|im_start|>", "<|im_end|>")
PLAIN_LABELS = {"system": "System", "user": "User", "assistant": "Assistant", "tool": "Tool"}
# The special tokens transformers passes to a chat template (its tokenizer's special_tokens_map).
TEMPLATE_TOKENS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token",
                   "mask_token")


class ChatTemplate(NamedTuple):
  """How conversations become text (see :func:`load_chat_template`).

  Attributes:
    name: ``"chatml"``, ``"plain"`` or ``"jinja:<where it came from>"``.
    source: the Jinja text (``""`` for the built-in templates).
    tokens: ``(name, text)`` of the special tokens the Jinja template sees (``bos_token``, ...).
    markers: the template's own tokens that a BPE tokenizer must keep as single ids.
  """
  name: str
  source: str = ""
  tokens: tuple[tuple[str, str], ...] = ()
  markers: tuple[str, ...] = ()

  @property
  def fingerprint(self) -> str:
    """SHA-256 of what decides the rendering (not where it came from)."""
    kind = self.name.split(":")[0]
    key = json.dumps([kind, self.source, list(self.tokens)], ensure_ascii=True)
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


CHATML = ChatTemplate("chatml", markers=CHATML_MARKERS)
PLAIN = ChatTemplate("plain")


def _token_text(value: Any) -> str | None:
  """A special token as tokenizer_config.json stores it: a string or ``{"content": ...}``."""
  if isinstance(value, Mapping):
    value = value.get("content")
  return value if isinstance(value, str) else None


def template_from_config(config: Mapping[str, Any], where: str = "tokenizer_config.json",
                         name: str = "default") -> ChatTemplate:
  """The :class:`ChatTemplate` of a parsed ``tokenizer_config.json``.

  ``chat_template`` is a string, or a list of ``{"name", "template"}`` from which ``name`` is taken
  (``"default"`` unless said otherwise). The markers are the added tokens of the configuration
  (``added_tokens_decoder``) whose text appears in the template, plus the special tokens the
  template names (``eos_token`` ...), whitespace-only tokens left out, as ``transformers`` finds a
  template's control tokens.
  """
  raw = config.get("chat_template")
  if isinstance(raw, list):
    named = {t.get("name"): t.get("template") for t in raw if isinstance(t, Mapping)}
    if name not in named:
      raise DataError(f"{where}: no chat template named {name!r} (has {sorted(named)})")
    raw = named[name]
  if not isinstance(raw, str) or not raw:
    raise DataError(f"{where}: no chat_template (a Jinja string) in the tokenizer configuration")
  tokens = tuple((k, t) for k in TEMPLATE_TOKENS if (t := _token_text(config.get(k))) is not None)
  added = [_token_text(v) for v in (config.get("added_tokens_decoder") or {}).values()]
  markers = {t for t in added if t and t.strip() and t in raw}
  markers |= {t for k, t in tokens if k in raw and t.strip()}
  return ChatTemplate(f"jinja:{where}", raw, tokens, tuple(sorted(markers)))


def load_chat_template(spec: str) -> ChatTemplate:
  """The template named by ``spec``.

  * ``"chatml"`` (default of the readers), ``"plain"``;
  * a ``tokenizer_config.json`` file (or a directory holding one), ``path::name`` for one of its
    named templates; a ``.jinja`` file holds the template alone (its markers are the ``<|...|>``
    strings in it);
  * ``"hf:<repo>[@revision]"``: the ``tokenizer_config.json`` of a Hub model (cached; fails at
    once offline, see :mod:`andrea_jax.data.hfhub`).

  Example:
    >>> load_chat_template("chatml").markers
    ('<|im_start|>', '<|im_end|>')
  """
  if spec in ("chatml", ""):
    return CHATML
  if spec == "plain":
    return PLAIN
  path, _, name = spec.partition("::")
  if path.startswith("hf:"):
    from andrea_jax.data import hfhub
    repo, revision = hfhub.split_name(path[3:])
    path = hfhub.hub_file(repo, "tokenizer_config.json", revision=revision,
                          what=f"chat template {spec!r}",
                          local_hint="Point the template at a local tokenizer_config.json.")
  path = os.path.expanduser(path)
  if os.path.isdir(path):
    path = os.path.join(path, "tokenizer_config.json")
  if not os.path.isfile(path):
    raise DataError(f"chat template {spec!r}: neither 'chatml', 'plain', 'hf:<repo>' nor an "
                    "existing tokenizer_config.json or .jinja file")
  with open(path, encoding="utf-8") as f:
    text = f.read()
  if path.endswith(".jinja"):
    return ChatTemplate(f"jinja:{path}", text, (), tuple(sorted(set(re.findall(r"<\|[^|\s]+\|>",
                                                                                 text)))))
  try:
    config = json.loads(text)
  except ValueError as e:
    raise DataError(f"chat template {spec!r}: {path} is not JSON ({e})") from e
  return template_from_config(config, path, name or "default")


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
    """``{% generation %}...{% endgeneration %}`` marks assistant text for masks: rendered as is."""
    tags = {"generation"}

    def parse(self, parser):
      lineno = next(parser.stream).lineno
      body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
      return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller):
      return caller()

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


def render_chat(template: ChatTemplate, messages: Sequence[Message]) -> str:
  """The text of a conversation (``messages`` from :func:`normalize_messages`).

  * ChatML: ``"".join(f"<|im_start|>{role}\\n{content}<|im_end|>\\n")``;
  * plain: ``"\\n\\n".join(f"{Role}: {content}")``, Role one of ``System``, ``User``,
    ``Assistant``, ``Tool``;
  * Jinja: ``template.render(messages=..., tools=None, documents=None,
    add_generation_prompt=False, **special tokens)``.

  Raises:
    ConversationError: the Jinja template raised (``raise_exception``, e.g. roles that do not
      alternate) or failed.

  Example:
    >>> render_chat(CHATML, [{"role": "user", "content": "Hi"}])
    '<|im_start|>user\\nHi<|im_end|>\\n'
  """
  if template.name == "chatml":
    return "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
  if template.name == "plain":
    return "\n\n".join(f"{PLAIN_LABELS[m['role']]}: {m['content']}" for m in messages)
  compiled = _compiled(template.source)
  try:
    return compiled.render(messages=[dict(m) for m in messages], tools=None, documents=None,
                           add_generation_prompt=False, **dict(template.tokens))
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
