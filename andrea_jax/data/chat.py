"""Conversations from the Hub's row shapes: message lists and OpenAssistant message trees.

A conversation is a list of messages ``{"role", "content", ...}`` (roles :data:`ROLES`); a template
of :mod:`andrea_jax.data.chat_templates` renders it as one document. Pure functions:

* :func:`normalize_messages` -- a row's list of messages in either shape the Hub uses: ``role`` /
  ``content`` (SmolTalk, OpenAI) or ``from`` / ``value`` (ShareGPT, Hermes 3; ``human`` -> user,
  ``gpt`` -> assistant), with an optional system prompt from a separate field put first. A
  message's other fields (``reasoning_content``, ``tool_calls``, ``name``, ...) are kept, those
  whose value is ``None`` dropped, as ``transformers``' ``apply_chat_template`` hands them to a
  template.
* :func:`tree_node`, :func:`tree_threads` -- OpenAssistant's message trees (one row per message,
  ``message_id`` / ``parent_id``, roles ``prompter`` / ``assistant``, the text in ``text``)
  flattened into threads: **every root-to-leaf path is one conversation**, in the order of the
  leaves' rows. Threads that share a prompt repeat it, as OpenAssistant's own thread export does;
  each reply the volunteers wrote is trained on once, at the end of its own thread. Messages whose
  parents close a loop (no root above them) are refused.

Bad input raises :class:`ConversationError` saying what is wrong with the conversation; the
reader (:mod:`andrea_jax.data.hub`) adds the dataset, the split and the row.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from andrea_jax.data.errors import DataError

ROLES = ("system", "user", "assistant", "tool")
# Role names of the Hub's shapes, mapped onto ROLES: ShareGPT/Hermes `from` values, OpenAssistant.
ROLE_NAMES = {"system": "system", "user": "user", "human": "user", "prompter": "user",
              "assistant": "assistant", "gpt": "assistant", "tool": "tool"}

Message = dict[str, Any]
# The keys of each shape that hold the role and the content (consumed, not passed on as fields).
_SHAPES = (("role", "content"), ("from", "value"))


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
  """``[{"role", "content", ...}]`` of a row's messages, roles mapped onto :data:`ROLES`.

  Each message is a mapping with ``role`` and ``content`` (OpenAI, SmolTalk) or ``from`` and
  ``value`` (ShareGPT, Hermes 3); ``human``/``prompter`` become ``user``, ``gpt`` ``assistant``.
  Its other fields follow ``role`` and ``content`` in their own order, as ``apply_chat_template``
  passes them to a template; a field whose value is ``None`` is dropped (Arrow fills a key absent
  from one message with None, and templates test ``message.tool_calls is defined``). The content
  may be missing only beside ``tool_calls`` (an OpenAI tool call has ``content: null``).

  Args:
    messages: the row's list of messages.
    system: a system prompt kept in a field of its own (``None`` or ``""``: none), put first.

  Raises:
    ConversationError: not a list, no messages, a message without a role, an unknown role,
      content that is not a string (e.g. ``None`` without ``tool_calls``, or a list of content
      parts).

  Example:
    >>> normalize_messages([{"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Hello"}])
    [{'role': 'user', 'content': 'Hi'}, {'role': 'assistant', 'content': 'Hello'}]
    >>> normalize_messages([{"role": "assistant", "content": "", "reasoning_content": "2+2=4"}])
    [{'role': 'assistant', 'content': '', 'reasoning_content': '2+2=4'}]
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
    shape = next((keys for keys in _SHAPES if m.get(keys[0]) is not None), None)
    if shape is None:
      raise ConversationError(f"{where} has no role (no 'role' or 'from'; keys {sorted(m)})")
    role = _role(m[shape[0]], where)
    message = {"role": role}
    content = m.get(shape[1])
    if content is not None or m.get("tool_calls") is None:
      message["content"] = _content(content, f"{where} ({role})")
    message.update((k, v) for k, v in m.items() if k not in shape and v is not None)
    out.append(message)
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
    TreeError: a duplicated ``message_id``, a ``parent_id`` that is not among the nodes, or
      messages whose parents close a loop (``a`` answers ``b`` which answers ``a``: no root above
      them, so no thread would hold them); its ``index`` is the offending node's (for a loop, the
      loop's first node in ``nodes``) and its message names every id of the loop.

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
  parent = [None if n.parent_id is None else index[n.parent_id] for n in nodes]
  _refuse_loops(nodes, parent)
  threads = []
  for leaf in range(len(nodes)):
    if has_child[leaf]:
      continue
    path = [leaf]
    while parent[path[-1]] is not None:
      path.append(parent[path[-1]])
    threads.append(path[::-1])
  return threads


def _refuse_loops(nodes: Sequence[TreeNode], parent: list[int | None]) -> None:
  """``TreeError`` naming the first closed loop of parents, if any: each node is walked up once
  (``O(n)``), marked as reaching a root once its walk does."""
  reaches_root = [False] * len(nodes)
  for start in range(len(nodes)):
    walk, on_walk, i = [], set(), start
    while i is not None and not reaches_root[i]:
      if i in on_walk:   # the walk came back to itself: a loop with no root above it
        loop = walk[walk.index(i):]
        ids = [nodes[j].message_id for j in sorted(loop)]
        raise TreeError(f"messages {ids} answer one another in a closed loop (each is another's "
                        "parent, none is a root): their threads have no first message", min(loop))
      walk.append(i)
      on_walk.add(i)
      i = parent[i]
    for j in walk:
      reaches_root[j] = True
