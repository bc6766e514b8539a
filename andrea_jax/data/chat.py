"""Conversations as text: the Hub's message shapes, OpenAssistant trees, and chat templates.

A conversation becomes one document: a list of messages ``{"role", "content"}`` (roles
:data:`ROLES`) rendered by a template. Pure functions, in the order a row goes through them:

* :func:`normalize_messages` -- a row's list of messages in either shape the Hub uses: ``role`` /
  ``content`` (SmolTalk, OpenAI) or ``from`` / ``value`` (ShareGPT, Hermes 3; ``human`` -> user,
  ``gpt`` -> assistant), with an optional system prompt from a separate field put first.
* :func:`tree_node`, :func:`tree_threads` -- OpenAssistant's message trees (one row per message,
  ``message_id`` / ``parent_id``, roles ``prompter`` / ``assistant``, the text in ``text``)
  flattened into threads: **every root-to-leaf path is one conversation**, in the order of the
  leaves' rows. Threads that share a prompt repeat it, as OpenAssistant's own thread export does;
  each reply the volunteers wrote is trained on once, at the end of its own thread.
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

Bad input raises :class:`ConversationError` saying what is wrong with the conversation; the
reader (:mod:`andrea_jax.data.hub`) adds the dataset, the split and the row.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from andrea_jax.data.errors import DataError
from andrea_jax.data.tokenizers import HFTokenizer, Tokenizer

ROLES = ("system", "user", "assistant", "tool")
# Role names of the Hub's shapes, mapped onto ROLES: ShareGPT/Hermes `from` values, OpenAssistant.
ROLE_NAMES = {"system": "system", "user": "user", "human": "user", "prompter": "user",
              "assistant": "assistant", "gpt": "assistant", "tool": "tool"}
CHATML_MARKERS = ("<|im_start|>", "<|im_end|>")
PLAIN_LABELS = {"system": "System", "user": "User", "assistant": "Assistant", "tool": "Tool"}
# The special tokens transformers passes to a chat template (its tokenizer's special_tokens_map).
TEMPLATE_TOKENS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token",
                   "mask_token")

Message = dict[str, str]


class ConversationError(DataError):
  """A conversation that cannot be rendered; the message says which message and why."""


def _role(value: Any, where: str) -> str:
  if value is None:
    raise ConversationError(f"{where} has no role")
  if not isinstance(value, str) or value.lower() not in ROLE_NAMES:
    raise ConversationError(f"{where} has the unknown role {value!r} (known: "
                            f"{sorted(ROLE_NAMES)})")
  return ROLE_NAMES[value.lower()]


def _content(value: Any, where: str) -> str:
  if not isinstance(value, str):
    raise ConversationError(f"{where} has content of type {type(value).__name__} ({value!r:.60}), "
                            "not a string")
  return value


def normalize_messages(messages: Any, *, system: Any = None) -> list[Message]:
  """``[{"role", "content"}]`` of a row's messages, roles mapped onto :data:`ROLES`.

  Each message is a mapping with ``role`` and ``content`` (OpenAI, SmolTalk) or ``from`` and
  ``value`` (ShareGPT, Hermes 3); ``human``/``prompter`` become ``user``, ``gpt`` ``assistant``.
  A missing key and ``None`` are the same (Arrow fills a key absent from one message with None).

  Args:
    messages: the row's list of messages.
    system: a system prompt kept in a field of its own (``None`` or ``""``: none), put first.

  Raises:
    ConversationError: not a list, no messages, a message without a role, an unknown role,
      content that is not a string (e.g. ``None``, or a list of content parts).

  Example:
    >>> normalize_messages([{"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Hello"}])
    [{'role': 'user', 'content': 'Hi'}, {'role': 'assistant', 'content': 'Hello'}]
  """
  if not isinstance(messages, (list, tuple)):
    raise ConversationError(f"the messages are a {type(messages).__name__}, not a list")
  if not messages:
    raise ConversationError("empty conversation (no messages)")
  out = []
  if system is not None and system != "":
    out.append({"role": "system", "content": _content(system, "the system prompt")})
  for i, m in enumerate(messages):
    where = f"message {i}"
    if not isinstance(m, Mapping):
      raise ConversationError(f"{where} is a {type(m).__name__}, not a mapping")
    if m.get("role") is not None:
      role, content = m["role"], m.get("content")
    elif m.get("from") is not None:
      role, content = m["from"], m.get("value")
    else:
      raise ConversationError(f"{where} has no role (no 'role' or 'from'; keys {sorted(m)})")
    role = _role(role, where)
    out.append({"role": role, "content": _content(content, f"{where} ({role})")})
  return out


class TreeNode(NamedTuple):
  """One message of a message tree: its id, its parent's id (``None`` at a root), role, text."""
  message_id: str
  parent_id: str | None
  role: str
  text: str


def tree_node(record: Mapping[str, Any], text_field: str = "text") -> TreeNode:
  """The :class:`TreeNode` of an OpenAssistant row (``message_id``, ``parent_id``, ``role``,
  ``text_field``); ``ConversationError`` for a missing id, role or text."""
  message_id = record.get("message_id")
  if not isinstance(message_id, str) or not message_id:
    raise ConversationError(f"the message has no message_id (got {message_id!r})")
  parent = record.get("parent_id")
  if parent is not None and not isinstance(parent, str):
    raise ConversationError(f"message {message_id!r}: parent_id {parent!r} is not a string")
  where = f"message {message_id!r}"
  role = _role(record.get("role"), where)
  return TreeNode(message_id, parent or None, role,
                  _content(record.get(text_field), f"{where} ({role})"))


class TreeError(ConversationError):
  """A broken message tree; ``index`` is the position of the offending node."""

  def __init__(self, message: str, index: int):
    super().__init__(message)
    self.index = index


def tree_threads(nodes: Sequence[TreeNode]) -> list[list[int]]:
  """Every root-to-leaf path of a forest of messages, as indices into ``nodes``, root first.

  Threads come in the order of their leaves in ``nodes``; a leaf is a message no other message
  answers. ``nodes`` may hold many trees, in any order.

  Raises:
    TreeError: a duplicated ``message_id``, a ``parent_id`` that is not among the nodes, or a
      cycle; its ``index`` is the offending node's.

  Example:
    >>> n = [TreeNode("a", None, "user", "Q"), TreeNode("b", "a", "assistant", "A1"),
    ...      TreeNode("c", "a", "assistant", "A2")]
    >>> tree_threads(n)
    [[0, 1], [0, 2]]
  """
  index: dict[str, int] = {}
  for i, node in enumerate(nodes):
    if node.message_id in index:
      raise TreeError(f"message {node.message_id!r} repeats the id of the message at index "
                      f"{index[node.message_id]}", i)
    index[node.message_id] = i
  has_child = [False] * len(nodes)
  for i, node in enumerate(nodes):
    if node.parent_id is not None:
      if node.parent_id not in index:
        raise TreeError(f"message {node.message_id!r} answers parent {node.parent_id!r}, which is "
                        "not in the split (a tree whose parent is missing)", i)
      has_child[index[node.parent_id]] = True
  threads = []
  for leaf, node in enumerate(nodes):
    if has_child[leaf]:
      continue
    path = [leaf]
    while nodes[path[-1]].parent_id is not None:
      path.append(index[nodes[path[-1]].parent_id])
      if len(path) > len(nodes):
        raise TreeError(f"message {node.message_id!r}: its parents form a cycle", leaf)
    threads.append(path[::-1])
  return threads


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
          "tokens: andrea_jax.data.chat.add_chat_tokens(tokenizer_json, "
          f"{list(template.markers)}, out_json), and use out_json as the tokenizer")


def add_chat_tokens(path: str | os.PathLike, markers: Sequence[str],
                    out_path: str | os.PathLike) -> HFTokenizer:
  """A copy of a ``tokenizers`` JSON file in which each marker is one added, non-special token.

  A marker the vocabulary lacks gets the next free id (the vocabulary grows by one); one that is
  already an added token keeps its id and is made non-special (this pipeline encodes special
  tokens spelled in text as text). The end-of-document token is left as it is.

  Example:
    >>> tok = add_chat_tokens("bpe.json", CHATML_MARKERS, "bpe_chat.json")   # doctest: +SKIP
    >>> len(tok.encode("<|im_start|>"))
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
