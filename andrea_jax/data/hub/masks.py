"""Which tokens of a conversation the loss counts (``loss_on``), and the token masks that say so.

A chat source's ``loss_on`` is one of :data:`LOSS_ON`:

* ``"all"`` (the default): every token; no mask is made or stored.
* ``"assistant"``: the assistant's turns only, as TRL's ``assistant_only_loss``, torchtune's
  ``train_on_input=False`` and axolotl's ``train_on_inputs: false`` train: each assistant turn is
  the text its message adds after the header that opens it, **its end-of-turn marker included**,
  the whitespace the template writes between turns left out. ChatML: ``content + "<|im_end|>"``;
  plain: ``content``; a Jinja template: the text between the conversation's first ``i`` messages
  rendered with ``add_generation_prompt=True`` (the header of turn ``i``) and its first ``i + 1``
  rendered without, a template whose renderings of a conversation's beginnings are not
  beginnings of its whole rendering (one that rewrites earlier turns) is refused for the row.
* ``"generation"``: the ``{% generation %}`` blocks of a Jinja template that marks them, as
  ``apply_chat_template(..., return_assistant_tokens_mask=True)`` finds them.

A token counts when the characters it covers overlap a counted span (``transformers``' rule for
``assistant_masks``): :func:`token_mask`. The end-of-document id that opens every prepared document
never counts under a mask. Masks are made once, when the data is prepared
(:mod:`andrea_jax.data.prepare_lib`), and stored beside the token shards.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from andrea_jax.data.hub.chat import ConversationError, Message
from andrea_jax.data.hub.templates import (PLAIN_LABELS, ChatTemplate, render_chat,
                                            render_generation_spans)
from andrea_jax.data.errors import DataError
from andrea_jax.data.hub.spec import LOSS_ON  # noqa: F401 (the option's values, with the spec)

Span = tuple[int, int]


def check_loss_on(loss_on: Any, template: ChatTemplate | None, where: str) -> None:
  """``DataError`` naming ``where`` (``"source 'chat'"``) unless ``loss_on`` is one of
  :data:`LOSS_ON` and ``template`` can make its mask: a conversation layout for anything but
  ``"all"``, a Jinja template with ``{% generation %}`` blocks for ``"generation"``.

  Example:
    >>> check_loss_on("generation", CHATML, "source 'chat'")   # doctest: +ELLIPSIS
    Traceback (most recent call last):
    DataError: source 'chat': loss_on 'generation' needs a Jinja chat template with ...
  """
  if loss_on not in LOSS_ON:
    raise DataError(f"{where}: loss_on must be one of {LOSS_ON}, got {loss_on!r}")
  if loss_on != "all" and template is None:
    raise DataError(f"{where}: loss_on {loss_on!r} needs conversations (layout 'messages' or "
                    "'tree'); a text source has no turns")
  if loss_on == "generation" and not template.marks_generation:
    raise DataError(f"{where}: loss_on 'generation' needs a Jinja chat template with "
                    f"{{% generation %}} blocks; {template.name} has none (loss_on 'assistant' "
                    "finds the assistant's turns without them)")


def loss_spans(template: ChatTemplate, messages: Sequence[Message], loss_on: str,
               tools: Any = None) -> tuple[str, list[Span]]:
  """``(text, spans)``: the conversation rendered as :func:`render_chat` does, and the
  ``[start, end)`` character spans of the text the loss counts under ``loss_on`` (``"assistant"``
  or ``"generation"``, see the module docstring), in order.

  Raises:
    ConversationError: the template failed, or (``"assistant"``, Jinja) it renders a beginning of
      the conversation as something other than a beginning of the whole.

  Example:
    >>> loss_spans(CHATML, [{"role": "user", "content": "Hi"},
    ...                     {"role": "assistant", "content": "Yo"}], "assistant")
    ('<|im_start|>user\\nHi<|im_end|>\\n<|im_start|>assistant\\nYo<|im_end|>\\n', [(52, 64)])
  """
  if loss_on == "generation":
    text, spans = render_generation_spans(template, messages, tools)
    return text, sorted(spans)
  text = render_chat(template, messages, tools)
  if template.name == "chatml":
    return text, _chatml_spans(messages)
  if template.name == "plain":
    return text, _plain_spans(messages)
  return text, _jinja_turn_spans(template, messages, tools, text)


def _chatml_spans(messages: Sequence[Message]) -> list[Span]:
  spans, at = [], 0
  for m in messages:
    head = len(f"<|im_start|>{m['role']}\n")
    body = len(m["content"]) + len("<|im_end|>")
    if m["role"] == "assistant":
      spans.append((at + head, at + head + body))
    at += head + body + 1   # the line break after <|im_end|>
  return spans


def _plain_spans(messages: Sequence[Message]) -> list[Span]:
  spans, at = [], 0
  for m in messages:
    head = len(PLAIN_LABELS[m["role"]]) + 2   # "Assistant: "
    if m["role"] == "assistant" and m["content"]:
      spans.append((at + head, at + head + len(m["content"])))
    at += head + len(m["content"]) + 2   # the blank line between paragraphs
  return spans


def _jinja_turn_spans(template: ChatTemplate, messages: Sequence[Message], tools: Any,
                      text: str) -> list[Span]:
  """Each assistant turn's span: what messages ``[:i + 1]`` add to the header that
  ``add_generation_prompt`` writes after messages ``[:i]``, trailing whitespace left out."""
  spans = []
  for i, m in enumerate(messages):
    if m["role"] != "assistant":
      continue
    head = render_chat(template, messages[:i], tools, add_generation_prompt=True)
    upto = render_chat(template, messages[:i + 1], tools)
    if not (upto.startswith(head) and text.startswith(upto)):
      raise ConversationError(
          f"the chat template {template.name} does not render message {i} (assistant) as a "
          "continuation of the messages before it (it rewrites earlier turns, or its header "
          "differs from its generation prompt), so the assistant's turn cannot be told apart: "
          "mark the assistant's text with {% generation %} and set loss_on='generation', or "
          "loss_on='all'")
    end = len(head) + len(upto[len(head):].rstrip())
    if end > len(head):
      spans.append((len(head), end))
  return spans


def token_mask(offsets_Nx2: np.ndarray, spans: Sequence[Span]) -> np.ndarray:
  """``[N]`` bool: which tokens the loss counts, token ``n`` covering characters
  ``[offsets[n, 0], offsets[n, 1])``: those that overlap a span, as ``transformers`` marks
  ``assistant_masks`` (a token counts when its end is past the start of the first span that ends
  after the token starts).

  Example:
    >>> token_mask(np.array([[0, 2], [2, 5], [5, 6], [6, 9]]), [(3, 6)]).tolist()
    [False, True, True, False]
  """
  offsets_Nx2 = np.asarray(offsets_Nx2, np.int64).reshape(-1, 2)
  if not len(spans):
    return np.zeros(offsets_Nx2.shape[0], bool)
  start_K, end_K = np.asarray(spans, np.int64).reshape(-1, 2).T
  k_N = np.searchsorted(end_K, offsets_Nx2[:, 0], side="right")   # first span ending after it
  inside_N = k_N < end_K.size
  return inside_N & (offsets_Nx2[:, 1] > start_K[np.minimum(k_N, end_K.size - 1)])


def encode_masked(tokenizer, docs: Sequence[tuple[str, Sequence[Span]]]
                  ) -> list[tuple[np.ndarray, np.ndarray]]:
  """``(ids [n] int32, mask [n] bool)`` of each ``(text, spans)``: the tokenizer's ids of the
  text, and :func:`token_mask` of its spans.

  Raises:
    DataError: the tokenizer gives no character offsets (``encode_batch_offsets``).

  Example:
    >>> encode_masked(load_tokenizer("bytes"), [("héllo", [(1, 2)])])[0][1].tolist()
    [False, True, True, False, False, False]
  """
  if not hasattr(tokenizer, "encode_batch_offsets"):
    raise DataError(f"tokenizer {tokenizer.name} gives no character offsets "
                    "(encode_batch_offsets), so no loss mask can be made with it: use loss_on "
                    "'all'")
  encoded = tokenizer.encode_batch_offsets([text for text, _ in docs])
  return [(ids_N, token_mask(offsets_Nx2, spans))
          for (ids_N, offsets_Nx2), (_, spans) in zip(encoded, docs)]
