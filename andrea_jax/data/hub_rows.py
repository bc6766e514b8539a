"""A dataset's rows as documents: texts, and conversations rendered with their loss spans.

:mod:`andrea_jax.data.hub` reads the rows in batches of columns; the functions here turn one
batch (``layout`` ``"text"`` or ``"messages"``) or a whole split (``"tree"``) into documents, in
row order, and name the row of every problem. A document is its text, or, when the source's
``loss_on`` is not ``"all"``, ``(text, spans)`` with the character spans the loss counts
(:mod:`andrea_jax.data.chat_masks`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from andrea_jax.data import chat, chat_masks
from andrea_jax.data.chat_templates import ChatTemplate, render_chat
from andrea_jax.data.errors import DataError

TREE_FIELDS = ("message_id", "parent_id", "role")
Document = str | tuple[str, list[tuple[int, int]]]
Where = Callable[[int], str]   # row number -> "source 'x': dataset 'y', split 'z', row n"


def renderer(template: ChatTemplate | None, loss_on: str) -> Callable[..., Document]:
  """``render(messages, tools=None)``: the document of a conversation, its text alone
  (``loss_on = "all"``: no spans are looked for) or with its loss spans.

  Example:
    >>> renderer(CHATML, "assistant")([{"role": "assistant", "content": "Yo"}])
    ('<|im_start|>assistant\nYo<|im_end|>\n', [(22, 34)])
  """
  if loss_on == "all":
    return lambda messages, tools=None: render_chat(template, messages, tools)
  return lambda messages, tools=None: chat_masks.loss_spans(template, messages, loss_on, tools)


def keep(value: Any, spec) -> bool:
  """Whether a row whose ``spec.filter_field`` holds ``value`` passes the filter.

  Example:
    >>> keep("fr", HubSpec("ds", filter_field="lang", filter_value=("en", "fr")))
    True
  """
  if isinstance(spec.filter_value, (tuple, list)):
    return value in spec.filter_value
  return value == spec.filter_value


def column(batch: dict[str, list], field: str, n: int) -> list:
  """The values of ``field`` in a batch of ``n`` rows; a streamed JSON batch lacks a key that no
  row of it has: the same as ``None`` in every row.

  Example:
    >>> column({"text": ["a", "b"]}, "lang", 2)
    [None, None]
  """
  return batch[field] if field in batch else [None] * n


def row_tools(value: Any, where: str) -> list | None:
  """A row's tool schemas as ``apply_chat_template(tools=...)`` takes them: a list of mappings,
  or ``None``; a JSON string holding such a list (as many datasets store it) is parsed.

  Example:
    >>> row_tools('[{"name": "f"}]', "row 0")
    [{'name': 'f'}]
  """
  if isinstance(value, str):
    try:
      value = json.loads(value) if value.strip() else None
    except ValueError as e:
      raise DataError(f"{where}: the tools are a string but not JSON ({e})") from None
  if value is not None and not (isinstance(value, list)
                                and all(isinstance(t, Mapping) for t in value)):
    raise DataError(f"{where}: the tools must be a list of JSON schemas (mappings), got "
                    f"{value!r:.80}")
  return value


def _rows(batch: dict[str, list]) -> int:
  return len(next(iter(batch.values()))) if batch else 0


def batch_documents(first: int, batch: dict[str, list], spec, render: Callable[..., Document],
                    where: Where) -> list[Document]:
  """The documents of one batch of rows (layout ``"text"`` or ``"messages"``), row ``first``
  first; empty texts dropped, a bad row a ``DataError`` naming it.

  Example:
    >>> batch_documents(0, {"text": ["a", "", "b"]}, HubSpec("ds"), renderer(None, "all"), str)
    ['a', 'b']
  """
  n = _rows(batch)
  kept = ([keep(v, spec) for v in column(batch, spec.filter_field, n)] if spec.filter_field
          else [True] * n)
  docs: list[Document] = []
  if spec.layout == "text":
    for j, text in enumerate(column(batch, spec.text_field, n)):
      if not kept[j]:
        continue
      if text is None:
        raise DataError(f"{where(first + j)}: missing field {spec.text_field!r}")
      if not isinstance(text, str):
        raise DataError(f"{where(first + j)}: field {spec.text_field!r} is a "
                        f"{type(text).__name__}, not a string")
      if text:
        docs.append(text)
    return docs
  systems = column(batch, spec.system_field, n) if spec.system_field else [None] * n
  tools = column(batch, spec.tools_field, n) if spec.tools_field else [None] * n
  for j, messages in enumerate(column(batch, spec.messages_field, n)):
    if not kept[j]:
      continue
    if messages is None:
      raise DataError(f"{where(first + j)}: missing field {spec.messages_field!r}")
    try:
      docs.append(render(chat.normalize_messages(messages, system=systems[j]),
                         row_tools(tools[j], where(first + j))))
    except chat.ConversationError as e:
      raise DataError(f"{where(first + j)}: {e}") from None
  return docs


def tree_documents(batches: Iterator[tuple[int, dict[str, list]]], spec,
                   render: Callable[..., Document], where: Where,
                   batch_rows: int) -> Iterator[list[Document]]:
  """Every root-to-leaf thread of the split's message trees, in lists of ``batch_rows``; the
  split is read whole first (a reply may come before the message it answers)."""
  nodes: list[chat.TreeNode] = []
  row_of: list[int] = []
  kept: list[bool] = []
  for first, batch in batches:
    n = _rows(batch)
    cols = {f: column(batch, f, n) for f in (*TREE_FIELDS, spec.text_field)}
    values = column(batch, spec.filter_field, n) if spec.filter_field else [None] * n
    for j in range(n):
      try:
        nodes.append(chat.tree_node({f: cols[f][j] for f in cols}, spec.text_field))
      except chat.ConversationError as e:
        raise DataError(f"{where(first + j)}: {e}") from None
      row_of.append(first + j)
      kept.append(not spec.filter_field or keep(values[j], spec))
  try:
    threads = chat.tree_threads(nodes)
  except chat.TreeError as e:
    raise DataError(f"{where(row_of[e.index])}: {e}") from None
  docs: list[Document] = []
  for path in threads:
    if not all(kept[i] for i in path):
      continue
    messages = [{"role": nodes[i].role, "content": nodes[i].text} for i in path]
    try:
      docs.append(render(messages))
    except chat.ConversationError as e:
      raise DataError(f"{where(row_of[path[-1]])} (the thread ending there): {e}") from None
    if len(docs) == batch_rows:
      yield docs
      docs = []
  if docs:
    yield docs
