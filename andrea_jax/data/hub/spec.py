"""What a Hugging Face source is, as a config: :class:`HubSpec` (the options are described in
:mod:`andrea_jax.data.hub.datasets`, which reads it). Light on purpose: the data pipeline recognises
a Hub source by this class without importing any of the code that reads one."""

from __future__ import annotations

from typing import Any, NamedTuple


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
