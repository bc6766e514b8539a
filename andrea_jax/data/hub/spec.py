"""What a Hugging Face source is, as a config: :class:`HubSpec` (the options are described in
:mod:`andrea_jax.data.hub.datasets`, which reads it), :func:`hf`, the format ``"hf"`` of
``data.files.<source>`` (:mod:`andrea_jax.data.formats`) that makes one, and :func:`check_fields`.
Light on purpose: the data pipeline recognises and checks a Hub source without importing any of
the code that reads one."""

from __future__ import annotations

import os
from typing import Any, NamedTuple

from andrea_jax import checks

LAYOUTS = ("text", "messages", "tree")
BUILDERS = ("json", "parquet", "csv", "text", "arrow")
LOSS_ON = ("all", "assistant", "generation")
"""Which tokens of a conversation the loss counts (:mod:`andrea_jax.data.hub.masks`)."""


class HubSpec(NamedTuple):
  """A source read through the ``datasets`` library (see the module docstring for each option).

  Example:
    >>> HubSpec("HuggingFaceTB/smoltalk", subset="all", layout="messages")   # doctest: +ELLIPSIS
    HubSpec(dataset='HuggingFaceTB/smoltalk', split='train', subset='all', ...)
  """
  dataset: str
  split: str = "train"
  subset: str | None = None
  data_files: tuple[str, ...] = ()
  revision: str | None = None
  layout: str = "text"
  text_field: str = "text"
  messages_field: str = "messages"
  system_field: str = ""
  template: str = "chatml"
  filter_field: str = ""
  filter_value: Any = None
  streaming: bool = False
  max_tokens: int = 0
  eval_fraction: float = 0.01
  format: str = "hf"
  loss_on: str = "all"
  tools_field: str = "tools"


def hf(dataset: str = "", paths: str = "", subset: str = "", split: str = "train",
       revision: str = "", layout: str = "text", text_field: str = "text",
       messages_field: str = "messages", system_field: str = "", template: str = "chatml",
       loss_on: str = "all", tools_field: str = "tools", filter_field: str = "",
       filter_value: str = "", streaming: bool = False) -> HubSpec:
  """The format ``"hf"``: a dataset read with the ``datasets`` library, as a :class:`HubSpec`
  (each field's meaning: :mod:`andrea_jax.data.hub.datasets`), checked.

  Args:
    dataset: a Hub name, a ``save_to_disk`` directory, or a builder (``"json"``, ...) of ``paths``.
    paths: comma-separated globs of local data files (with a builder); "" = none.
    subset: the dataset's configuration; "" = its default.
    split: the split read.
    revision: a Hub revision (commit, tag, branch); "" = the newest.
    layout: ``"text"`` (a text field), ``"messages"`` (a conversation), ``"tree"`` (OASST).
    text_field: layouts ``"text"``, ``"tree"``: the field holding the text.
    messages_field: layout ``"messages"``: the list of messages.
    system_field: layout ``"messages"``: a field holding a system prompt ("" = none).
    template: ``"chatml"``, ``"plain"``, a tokenizer folder or its ``tokenizer_config.json``, a
      ``.jinja`` or ``.json`` template file, or ``"hf:<repo>"``; ``"path::name"``: a named one.
    loss_on: the tokens of a conversation the loss counts: ``"all"``, ``"assistant"`` or
      ``"generation"``.
    tools_field: layout ``"messages"``: a row's tool schemas, passed to the template if present.
    filter_field: keep only rows whose field equals ``filter_value`` ("" = every row).
    filter_value: comma-separated values of ``filter_field`` to keep.
    streaming: stream the dataset instead of downloading it whole.

  Example:
    >>> hf("HuggingFaceTB/smoltalk", subset="all", layout="messages").subset
    'all'
  """
  values = [v.strip() for v in str(filter_value).split(",") if v.strip()]
  spec = HubSpec(
      dataset=dataset, split=split, subset=subset or None,
      data_files=tuple(p.strip() for p in paths.split(",") if p.strip()),
      revision=revision or None, layout=layout, text_field=text_field,
      messages_field=messages_field, system_field=system_field, template=template,
      filter_field=filter_field, filter_value=(values[0] if len(values) == 1 else values or None),
      streaming=streaming, loss_on=loss_on, tools_field=tools_field)
  check_fields(spec)
  return spec


def _is_scalar(v: Any) -> bool:
  return v is None or isinstance(v, (str, int, float, bool))


def check_fields(spec: HubSpec) -> None:
  """Raises ``ValueError`` naming the field (``"split must be ..."``) for an invalid dataset
  field of ``spec`` (the fields of the format ``"hf"``)."""
  bad = lambda field, why: ValueError(f"{field} {why}, got {getattr(spec, field)!r}")
  if not isinstance(spec.dataset, str) or (not spec.dataset and not spec.data_files):
    raise bad("dataset", "must name a Hub dataset, a save_to_disk directory or a builder")
  if isinstance(spec.data_files, str):
    raise bad("data_files", "must be a list of globs, not a string")
  if spec.data_files and spec.dataset not in ("",) + BUILDERS:
    raise bad("dataset", f"must be one of {BUILDERS} (or '') when data_files (paths) is set")
  path = os.path.expanduser(spec.dataset)
  if not spec.data_files and os.path.isdir(path) and not saved_dir(path):
    raise ValueError(f"dataset: directory {spec.dataset!r} was not written by save_to_disk (no "
                     "dataset_info.json or dataset_dict.json); list its files in data_files "
                     "instead")
  if (not spec.data_files and not os.path.isdir(path)
      and spec.dataset.startswith((os.sep, ".", "~"))):
    raise bad("dataset", "looks like a path but is no directory")
  if not isinstance(spec.split, str) or not spec.split:
    raise bad("split", "must be a non-empty string")
  if spec.layout not in LAYOUTS:
    raise bad("layout", f"must be one of {LAYOUTS}")
  field = {"text": "text_field", "messages": "messages_field", "tree": "text_field"}[spec.layout]
  if not isinstance(getattr(spec, field), str) or not getattr(spec, field):
    raise bad(field, f"must name a field for layout {spec.layout!r}")
  if spec.filter_field and not (_is_scalar(spec.filter_value) or (
      isinstance(spec.filter_value, (tuple, list)) and all(map(_is_scalar, spec.filter_value)))):
    raise bad("filter_value", "must be a string, number, bool, None or a list of them")
  try:
    checks.flag("streaming", spec.streaming)
  except TypeError as e:   # a ValueError, as every other field's here
    raise ValueError(str(e)) from None
  if spec.loss_on not in LOSS_ON:
    raise bad("loss_on", f"must be one of {LOSS_ON}")
  if spec.loss_on != "all" and spec.layout == "text":
    raise bad("loss_on", "needs conversations (layout 'messages' or 'tree'; layout 'text' has no "
              "turns)")
  if not isinstance(spec.tools_field, str):
    raise bad("tools_field", "must be a field name ('' = none)")


def saved_dir(path: str) -> bool:
  """Whether ``path`` is a directory written by ``save_to_disk``."""
  return any(os.path.isfile(os.path.join(path, f))
             for f in ("dataset_info.json", "state.json", "dataset_dict.json"))
