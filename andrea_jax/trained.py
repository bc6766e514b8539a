"""A trained model with what reads and writes its text: from a run's checkpoint or a GPT-2 folder.

The sampler, the export and the lm-evaluation-harness backend (``python -m andrea_jax.sample``,
``.export``, ``.harness``) take a :class:`TrainedModel`:

* :func:`from_workdir` -- a checkpoint of a run (``load_checkpoint``: its config as trained),
  its tokenizer (``data.tokenizer``), and its chat template when the run trained on conversations
  (:func:`run_chat_template`);
* :func:`from_hf` -- a folder as ``transformers`` saves GPT-2 (``config.json``,
  ``model.safetensors``, ``tokenizer.json``; ``python -m andrea_jax.export`` writes one) or
  ``hf:<repo>`` from the Hub cache; its chat template from ``tokenizer_config.json``.

Example:
  >>> model = from_workdir("runs/tiny")
  >>> model.tokenizer.encode("The "), model.config.max_len, model.step
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from andrea_jax import convert
from andrea_jax import data as data_lib
from andrea_jax import pretrained
from andrea_jax.checkpoint import load_checkpoint
from andrea_jax.model import ModelConfig, PyTree

CONVERSATION_LAYOUTS = ("messages", "tree")


@dataclasses.dataclass(frozen=True)
class TrainedModel:
  """Parameters, their model config, the tokenizer, and where they came from.

  Attributes:
    params: the parameter tree (float32).
    config: the :class:`ModelConfig`, its ``dtype`` float32 (sampling, export and scoring compute
      in float32).
    tokenizer: the tokenizer the model was trained with (``encode``, ``decode``, ``eod_id``).
    origin: the workdir or folder it was read from.
    step: the checkpoint's step (a folder's, when its ``andrea_run.json`` says; else ``None``).
    template_spec: where its chat template comes from (``data.files.<source>.template``, or the
      folder), ``None`` when it has none; :meth:`chat_template` loads it.
    run_config: the run's config as trained (a dict), ``None`` for a folder.
  """
  params: PyTree
  config: ModelConfig
  tokenizer: Any
  origin: str
  step: int | None = None
  template_spec: str | None = None
  run_config: dict | None = None

  @property
  def vocab_limit(self) -> int:
    """Ids a sample may take: those both the model and the tokenizer have."""
    return min(self.tokenizer.vocab_size, self.config.vocab_size)

  def chat_template(self):
    """The :class:`andrea_jax.data.hub.templates.ChatTemplate` the model was trained with;
    ``ValueError`` naming the model when it has none."""
    if self.template_spec is None:
      raise ValueError(f"{self.origin} was not trained on conversations (no source with layout "
                       "'messages' or 'tree'; a folder without a chat_template in its "
                       "tokenizer_config.json): it has no chat template")
    from andrea_jax.data.hub.template_files import load_chat_template
    return load_chat_template(self.template_spec)


def run_chat_template(data, trained_sources: tuple[str, ...]) -> str | None:
  """The chat template spec of the conversation sources a run trained on
  (``data.files.<source>.template`` of each read as conversations: ``format = "hf"`` with layout
  ``messages`` or ``tree``), the first one's when they differ; ``None`` when it trained on none.
  ``data`` is the run's :class:`andrea_jax.data.DataSpec`.

  Example:
    >>> run_chat_template(run.data, run.trainable)
    'chatml'
  """
  if data.corpus != "files":
    return None
  for name in trained_sources:
    source = data.files.get(name)
    reader = source.reader if source is not None else None
    if getattr(reader, "layout", None) in CONVERSATION_LAYOUTS:   # a dataset of conversations
      return getattr(reader, "template", None) or "chatml"
  return None


def from_workdir(workdir: str, step: int | None = None) -> TrainedModel:
  """The model of checkpoint ``step`` (default the newest) of the run in ``workdir``, read only.

  Raises ``FileNotFoundError`` naming the saved steps when there is no such checkpoint.
  """
  saved = load_checkpoint(workdir, step)
  run = saved.run
  tokenizer = data_lib.load_tokenizer(run.data.tokenizer)
  config = dataclasses.replace(run.model, dtype="float32")
  return TrainedModel(params=saved.params, config=config, tokenizer=tokenizer,
                      origin=os.path.abspath(workdir), step=saved.step,
                      template_spec=run_chat_template(run.data, run.trainable),
                      run_config=saved.config.to_dict())


def _folder_tokenizer(folder: pretrained.HFFolder):
  if folder.tokenizer is None:
    raise ValueError(f"{folder.where} has no tokenizer.json (nor tokenizer.model): its text cannot "
                     "be encoded")
  if folder.tokenizer.endswith(".model"):
    return data_lib.SentencePieceTokenizer(folder.tokenizer, name=folder.where)
  return data_lib.HFTokenizer(folder.tokenizer, name=folder.where)


def _folder_template(folder: pretrained.HFFolder) -> str | None:
  if folder.tokenizer is None or folder.where.startswith(pretrained.HUB_PREFIX):
    return None
  home = os.path.dirname(folder.tokenizer)
  config = os.path.join(home, "tokenizer_config.json")
  has = os.path.isfile(os.path.join(home, "chat_template.jinja"))
  if not has and os.path.isfile(config):
    import json
    with open(config, encoding="utf-8") as f:
      has = bool(json.load(f).get("chat_template"))
  return home if has else None


def from_hf(spec: str) -> TrainedModel:
  """The model of a GPT-2 folder (or ``hf:<repo>[@revision]``), with the tokenizer beside it.

  Strict as :func:`andrea_jax.pretrained.from_hf`: every missing, unexpected or misshapen tensor
  is named; the end-of-document id is the tokenizer's and must be the model's ``eos_token_id``.

  Example:
    >>> from_hf("runs/tiny-hf").config.max_len
    128
  """
  folder = pretrained.read_hf_folder(spec)
  where = os.path.join(spec, "config.json")
  config = convert.model_config_from_hf(folder.config, where)
  problems = convert.tensor_problems(pretrained.safetensors_shapes(folder.weights), config)
  if problems:
    raise ValueError(f"{folder.weights}: " + "; ".join(problems))
  tokenizer = _folder_tokenizer(folder)
  eos = folder.config.get("eos_token_id")
  if isinstance(eos, int) and eos != tokenizer.eod_id:
    raise ValueError(f"{where}: eos_token_id = {eos}, but the tokenizer's end-of-document token "
                     f"is id {tokenizer.eod_id}")
  import safetensors.numpy
  params = convert.from_hf_state_dict(safetensors.numpy.load_file(folder.weights), config)
  return TrainedModel(params=params, config=config, tokenizer=tokenizer,
                      origin=spec if spec.startswith(pretrained.HUB_PREFIX)
                      else os.path.abspath(spec),
                      step=folder.step, template_spec=_folder_template(folder))


def load(workdir: str | None = None, step: int | None = None,
         hf: str | None = None) -> TrainedModel:
  """:func:`from_workdir` or :func:`from_hf`, as the command lines' ``--workdir [--step]`` and
  ``--hf`` name them; ``ValueError`` unless exactly one is given."""
  if (workdir is None) == (hf is None):
    raise ValueError("give either --workdir (a run, with --step for one of its checkpoints) or "
                     "--hf (a Hugging Face GPT-2 folder, or hf:<repo>)")
  if hf is not None and step is not None:
    raise ValueError(f"--step {step} picks a checkpoint of a run (--workdir); a folder (--hf) has "
                     "one set of weights")
  return from_workdir(workdir, step) if workdir is not None else from_hf(hf)
