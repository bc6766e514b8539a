"""Conversations from the Hub's row shapes: message lists and OpenAssistant message trees.

A conversation is a list of messages ``{"role", "content"}`` (roles :data:`ROLES`); a template of
:mod:`andrea_jax.data.chat_templates` renders it as one document. Pure functions:

* :func:`normalize_messages` -- a row's list of messages in either shape the Hub uses: ``role`` /
  ``content`` (SmolTalk, OpenAI) or ``from`` / ``value`` (ShareGPT, Hermes 3; ``human`` -> user,
  ``gpt`` -> assistant), with an optional system prompt from a separate field put first.
* :func:`tree_node`, :func:`tree_threads` -- OpenAssistant's message trees (one row per message,
  ``message_id`` / ``parent_id``, roles ``prompter`` / ``assistant``, the text in ``text``)
  flattened into threads: **every root-to-leaf path is one conversation**, in the order of the
  leaves' rows. Threads that share a prompt repeat it, as OpenAssistant's own thread export does;
  each reply the volunteers wrote is trained on once, at the end of its own thread.

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
