"""Pretrained weights for a run to start from: a Hugging Face GPT-2 folder, a Hub model, a run.

The ``init`` section of a run's config names at most one source (:func:`init_spec`):

* ``init.from_hf``: a folder as ``transformers`` saves GPT-2 (``config.json`` and
  ``model.safetensors``; a ``tokenizer.json`` or ``tokenizer.model`` beside them is checked, see
  below), such as one ``python -m andrea_jax.export`` wrote; or ``hf:<repo>[@revision]``, the same
  files of a Hub model through the Hugging Face cache (refused at once offline when not cached,
  as tokenizers are: :mod:`andrea_jax.data.hub.files`);
* ``init.from_run``: another run's workdir, ``DIR`` (its newest checkpoint) or ``DIR:STEP``; read
  only.

Parameters only: the run starts at step 0 with a fresh optimizer and its learning-rate warmup
(:mod:`andrea_jax.resume` applies it, and only when the run's own workdir has no checkpoint).

Loading is strict, and every mismatch is named at once, before anything compiles: the
architecture (``num_layers``, ``num_heads``, ``d_model``, ``d_mlp``) against the run's ``model``
section, the vocabulary against the run's (``model.vocab_size``, by default the tokenizer's),
``model.max_len`` above the source's positions, each missing, unexpected or misshapen tensor. A
``model.max_len`` below the source's positions keeps the first ``max_len`` rows of the position
table (nanoGPT's ``crop_block_size``), said in one line. Where the source has a tokenizer, its
encoding of :data:`PROBE` must equal the run's tokenizer's, or the run is refused naming both.

The source, the SHA-256 of its weights (of ``model.safetensors``; of the parameters for a run,
:func:`params_sha256`) and its step go into the run's recorded config (``init.sha256``,
``init.step``, ``init.path``).

Example:
  >>> spec = init_spec(ml_collections.ConfigDict({"from_hf": "runs/tiny-hf", "from_run": ""}))
  >>> source = from_hf(spec.from_hf, run.model, load_tokenizer("bytes"))
  >>> source.record["sha256"]
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from typing import Any, NamedTuple

import jax
import numpy as np

from andrea_jax import checks, convert
from andrea_jax.data import hashing
from andrea_jax.data.errors import DataError
from andrea_jax.model import ModelConfig, PyTree

HUB_PREFIX = "hf:"
# Text whose encoding tells two tokenizers apart: ASCII, accents, CJK, emoji, tabs, blank lines,
# runs of spaces, code.
PROBE = ("The quick brown fox jumps over the lazy dog. Ça coûte 3,50 € — naïve café.\n\n"
         "漢字とかな、한국어; 😀🚀 emoji\tand\ttabs\n    indented:  def f(x):\n        return x**2\n")
_ARCH = (("num_layers", "n_layer"), ("num_heads", "n_head"), ("d_model", "n_embd"),
         ("d_mlp", "n_inner"), ("layer_norm_eps", "layer_norm_epsilon"))


class InitError(DataError):
  """The init source cannot be read, or does not fit the run (the message names the mismatch)."""


@dataclasses.dataclass(frozen=True)
class InitSpec:
  """The ``init`` section, validated: one source (the other is ``""``)."""
  from_hf: str = ""          # a folder or "hf:<repo>[@revision]"
  from_run: str = ""         # another run's workdir
  run_step: int | None = None   # from_run's "DIR:STEP" step; None: the newest

  @property
  def source(self) -> str:
    """``init.from_hf = ...`` or ``init.from_run = ...``, as the config gives it."""
    if self.from_hf:
      return f"init.from_hf = {self.from_hf!r}"
    step = f":{self.run_step}" if self.run_step is not None else ""
    return f"init.from_run = {self.from_run + step!r}"


def init_spec(section: Any) -> InitSpec | None:
  """The validated ``init`` section (``None`` when it names no source, or is absent).

  Raises ``TypeError`` for a field that is not a string and ``ValueError`` when both sources are
  set or ``from_run``'s step is not a non-negative integer.

  Example:
    >>> init_spec({"from_hf": "", "from_run": "runs/tiny:500"}).run_step
    500
  """
  if section is None:
    return None
  if not hasattr(section, "get"):
    raise TypeError(f"init must be a section with from_hf and from_run, got {section!r}")
  from_hf, from_run = section.get("from_hf", ""), section.get("from_run", "")
  for name, value in (("from_hf", from_hf), ("from_run", from_run)):
    checks.text(f"init.{name}", value, hint="a path, or '' for none")
  if from_hf and from_run:
    raise ValueError(f"cannot specify both init.from_hf = {from_hf!r} and init.from_run = "
                     f"{from_run!r}: a run starts from one set of weights")
  if from_hf == HUB_PREFIX:
    raise ValueError("init.from_hf = 'hf:' names no repository (hf:<repo>[@revision])")
  if not (from_hf or from_run):
    return None
  step = None
  head, sep, tail = from_run.rpartition(":")
  if sep and head and (tail.isdigit() or tail.lstrip("-").isdigit()):
    if not tail.isdigit():
      raise ValueError(f"init.from_run = {from_run!r}: the step after ':' must be >= 0")
    from_run, step = head, int(tail)
  return InitSpec(from_hf=from_hf, from_run=from_run, run_step=step)


class Source(NamedTuple):
  """Weights to start from: ``params`` in the run's layout (its padded vocabulary, its
  ``max_len`` positions), ``record`` (what goes into the recorded config's ``init`` section:
  ``path``, ``sha256``, ``step``), ``notes`` (lines to print: a cropped position table)."""
  params: PyTree
  record: dict
  notes: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class HFFolder:
  """The files of a GPT-2 model folder (local, or a Hub snapshot in the cache)."""
  where: str                   # as named: a path or "hf:<repo>"
  config: dict                 # config.json
  weights: str                 # model.safetensors
  tokenizer: str | None        # tokenizer.json or tokenizer.model, when there is one
  step: int | None = None      # from andrea_run.json, when an export of this package wrote it


def read_hf_folder(spec: str) -> HFFolder:
  """The files of the GPT-2 folder ``spec`` (a directory, or ``hf:<repo>[@revision]``).

  Raises :class:`InitError` naming the folder and the missing file (or, for the Hub, what the
  cache and the network said).
  """
  if spec.startswith(HUB_PREFIX):
    return _hub_folder(spec)
  folder = os.path.expanduser(spec)
  if not os.path.isdir(folder):
    raise InitError(f"{spec}: not a directory (a Hugging Face GPT-2 folder with config.json and "
                    "model.safetensors, or hf:<repo>)")
  files = {}
  for name in ("config.json", "model.safetensors"):
    files[name] = os.path.join(folder, name)
    if not os.path.isfile(files[name]):
      raise InitError(f"{files[name]} is missing (a GPT-2 folder holds config.json and "
                      "model.safetensors, as save_pretrained writes them)")
  tokenizer = next((os.path.join(folder, n) for n in ("tokenizer.json", "tokenizer.model")
                    if os.path.isfile(os.path.join(folder, n))), None)
  provenance = _read_json(os.path.join(folder, "andrea_run.json"), optional=True) or {}
  step = provenance.get("step") if isinstance(provenance.get("step"), int) else None
  return HFFolder(spec, _read_json(files["config.json"]), files["model.safetensors"], tokenizer,
                  step)


def _hub_folder(spec: str) -> HFFolder:
  from andrea_jax.data.hub import files as hfhub
  repo, revision = hfhub.split_name(spec[len(HUB_PREFIX):])
  what = f"init source {spec!r}"
  hint = ("To use a local folder instead, download it once with network (hf download "
          f"{repo} config.json model.safetensors tokenizer.json --local-dir DIR) and set "
          "init.from_hf = DIR.")
  kw = dict(revision=revision, what=what, local_hint=hint)
  try:
    config = hfhub.hub_file(repo, "config.json", **kw)
    weights = hfhub.hub_file(repo, "model.safetensors", **kw)
  except DataError as e:
    raise InitError(str(e)) from e
  tokenizer = hfhub.optional_hub_file(repo, "tokenizer.json", **kw)
  return HFFolder(spec, _read_json(config), weights, tokenizer)


def _read_json(path: str, optional: bool = False) -> dict | None:
  try:
    with open(path, encoding="utf-8") as f:
      value = json.load(f)
  except FileNotFoundError:
    if optional:
      return None
    raise InitError(f"{path} is missing") from None
  except (OSError, ValueError) as e:
    raise InitError(f"{path} is not readable JSON ({e})") from e
  if not isinstance(value, dict):
    raise InitError(f"{path} holds a JSON {type(value).__name__}, not an object")
  return value


def safetensors_shapes(path: str) -> dict[str, tuple[int, ...]]:
  """``name -> shape`` of every tensor of a safetensors file, its data left unread."""
  import safetensors
  try:
    with safetensors.safe_open(path, framework="numpy") as f:
      return {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
  except Exception as e:  # safetensors raises its own SafetensorError for a damaged header
    raise InitError(f"{path}: not a safetensors file ({e})") from e


file_sha256 = hashing.sha256_file
"""SHA-256 of a file's bytes, what ``sha256sum`` prints
(:func:`andrea_jax.data.hashing.sha256_file`)."""


def params_sha256(params: PyTree) -> str:
  """SHA-256 of a parameter tree: each leaf's path, shape and float32 bytes, in path order.

  Example:
    >>> params_sha256(params) == params_sha256(jax.tree.map(np.asarray, params))
    True
  """
  h = hashlib.sha256()
  leaves = jax.tree_util.tree_flatten_with_path(params)[0]
  for path, leaf in sorted(leaves, key=lambda kv: jax.tree_util.keystr(kv[0])):
    value = np.ascontiguousarray(np.asarray(leaf, np.float32))
    h.update(f"{jax.tree_util.keystr(path)}{value.shape}".encode())
    h.update(value.tobytes())
  return h.hexdigest()


def architecture_problems(source: ModelConfig, mcfg: ModelConfig, where: str,
                          tokenizer_hint: str = "") -> list[str]:
  """Every field of the run's ``model`` section the source's architecture contradicts, one line
  each naming both values (``[]`` when the weights fit); ``max_len`` only when the run's exceeds
  the source's positions."""
  out = []
  for ours, hf in _ARCH:
    if getattr(source, ours) != getattr(mcfg, ours):
      out.append(f"model.{ours} = {getattr(mcfg, ours)} but {where} has {getattr(source, ours)} "
                 f"({hf})")
  if source.vocab_size != mcfg.vocab_size:
    out.append(f"the run's vocabulary has {mcfg.vocab_size} ids{tokenizer_hint} but {where} has "
               f"{source.vocab_size} (vocab_size): set data.tokenizer to the source's tokenizer "
               "(hf:gpt2 for GPT-2's weights) and model.vocab_size = 0")
  if mcfg.max_len > source.max_len:
    out.append(f"model.max_len = {mcfg.max_len} exceeds the {source.max_len} positions of {where} "
               "(n_positions): lower it (a smaller one keeps the first rows of the position "
               "table)")
  return out


def _refuse(where: str, problems: list[str], fix: str = "") -> None:
  if problems:
    raise InitError(f"the weights of {where} do not fit this run: " + "; ".join(problems)
                    + (f". {fix}" if fix else ""))


def _overrides(source: ModelConfig, mcfg: ModelConfig) -> str:
  flags = [f"--config.model.{ours}={getattr(source, ours)}" for ours, _ in _ARCH
           if getattr(source, ours) != getattr(mcfg, ours)]
  if mcfg.max_len > source.max_len:
    flags.append(f"--config.model.max_len={source.max_len}")
  return f"To start from it: {' '.join(flags)}" if flags else ""


def crop_positions(params: PyTree, max_len: int) -> PyTree:
  """``params`` with the position table cut to its first ``max_len`` rows."""
  return {**params, "wpe": {"embedding": params["wpe"]["embedding"][:max_len]}}


def _source_tokens(path: str) -> list[int]:
  """The ids a source folder's tokenizer gives :data:`PROBE` (no special tokens added)."""
  if path.endswith(".model"):
    import sentencepiece as spm
    return list(spm.SentencePieceProcessor(model_file=path).encode(PROBE))
  import tokenizers
  try:
    tok = tokenizers.Tokenizer.from_file(path)
  except Exception as e:  # the library raises plain Exceptions
    raise InitError(f"{path}: not a tokenizers JSON file ({e})") from e
  return list(tok.encode(PROBE, add_special_tokens=False).ids)


def check_probe(theirs: list[int], tokenizer, where: str, spec: str) -> None:
  """:class:`InitError` unless ``theirs`` (the source's encoding of :data:`PROBE`) equals the run's
  tokenizer's, naming both tokenizers and where the encodings part."""
  ours = [int(i) for i in tokenizer.encode(PROBE)]
  if ours == theirs:
    return
  at = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), min(len(ours),
                                                                             len(theirs)))
  raise InitError(
      f"the tokenizer of {where} and the run's data.tokenizer = {spec!r} encode the same text "
      f"differently ({len(theirs)} ids against {len(ours)}; first difference at id {at}: "
      f"{theirs[at:at + 4]} against {ours[at:at + 4]}): the weights would read other tokens. "
      "Set data.tokenizer to the source's tokenizer")


def from_hf(spec: str, mcfg: ModelConfig, tokenizer) -> Source:
  """The weights of the GPT-2 folder (or ``hf:<repo>``) ``spec``, checked against the run's model
  config ``mcfg`` and ``tokenizer`` (see the module docstring), in the run's layout.

  Example:
    >>> from_hf("runs/tiny-hf", run.model, tok).record["step"]
    1000
  """
  folder = read_hf_folder(spec)
  where = f"init.from_hf = {spec!r}"
  try:
    source = convert.model_config_from_hf(folder.config, os.path.join(spec, "config.json"),
                                          vocab_multiple=mcfg.vocab_multiple)
  except ValueError as e:
    raise InitError(str(e)) from e
  hint = f" (data.tokenizer = {tokenizer.name!r} has {tokenizer.vocab_size})"
  _refuse(where, architecture_problems(source, mcfg, where, hint), _overrides(source, mcfg))
  at_source = dataclasses.replace(mcfg, max_len=source.max_len)
  _refuse(f"{where} ({folder.weights})",
          convert.tensor_problems(safetensors_shapes(folder.weights), at_source))
  if folder.tokenizer is not None:
    check_probe(_source_tokens(folder.tokenizer), tokenizer, f"{where} ({folder.tokenizer})",
                tokenizer.name)
  import safetensors.numpy
  try:
    params = convert.from_hf_state_dict(safetensors.numpy.load_file(folder.weights), at_source)
  except (ValueError, TypeError) as e:   # an untied head; a dtype numpy cannot hold
    raise InitError(f"{folder.weights}: {e}") from e
  return _finish(params, source.max_len, mcfg, {
      "path": os.path.abspath(folder.weights) if not spec.startswith(HUB_PREFIX)
      else folder.weights, "sha256": file_sha256(folder.weights), "step": folder.step})


def from_params(params: PyTree, source: ModelConfig, source_tokenizer, step: int,
                mcfg: ModelConfig, tokenizer, where: str, path: str) -> Source:
  """Another run's parameters (``source`` its model config, ``source_tokenizer`` its tokenizer,
  ``step`` its checkpoint, ``path`` its workdir, ``where`` how the config names it), checked as
  :func:`from_hf` checks a folder and put in the run's layout (its own vocabulary padding, its
  ``max_len``)."""
  _refuse(where, architecture_problems(source, mcfg, where), _overrides(source, mcfg))
  if source_tokenizer.fingerprint != tokenizer.fingerprint:
    check_probe([int(i) for i in source_tokenizer.encode(PROBE)], tokenizer,
                f"{where} (data.tokenizer = {source_tokenizer.name!r})", tokenizer.name)
  host = jax.tree.map(lambda x: np.asarray(x, np.float32), params)
  wte = host["wte"]["embedding"][:mcfg.vocab_size]
  pad = mcfg.padded_vocab_size - mcfg.vocab_size
  host["wte"] = {"embedding": np.concatenate([wte, np.zeros((pad, wte.shape[1]), np.float32)])}
  return _finish(host, source.max_len, mcfg, {"path": os.path.abspath(path),
                                              "sha256": params_sha256(params), "step": step})


def _finish(params: PyTree, positions: int, mcfg: ModelConfig, record: dict) -> Source:
  notes = ()
  if mcfg.max_len < positions:
    params = crop_positions(params, mcfg.max_len)
    notes = (f"init: model.max_len = {mcfg.max_len} keeps the first {mcfg.max_len} of the "
             f"source's {positions} position embeddings",)
  return Source(params, record, notes)
