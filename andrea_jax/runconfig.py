"""From a config to a validated run: every check happens here, before anything compiles.

:func:`build` turns the ``ConfigDict`` into the static pieces of a run (the frozen ``ModelConfig``, the
optimizer, the curriculum tables, the detector's settings). Each section's own validator names the
field and the value it rejects; the cross-section checks (the context against the model, the batch
against the micro-batches, warmup against the run length) live here.
"""

from __future__ import annotations

import collections
import dataclasses
import warnings
from collections.abc import Callable
from typing import Any

import jax
import ml_collections

from andrea_jax import checks
from andrea_jax import cliff as cliff_lib
from andrea_jax import curriculum
from andrea_jax.curriculum import rewards as rewards_lib
from andrea_jax import hooks as hooks_lib
from andrea_jax import optim
from andrea_jax import plugins
from andrea_jax import pretrained
from andrea_jax import sharding
from andrea_jax import sources as sources_lib
from andrea_jax import step as step_lib
from andrea_jax import probes as probes_lib
from andrea_jax.data.config import DataSpec, data_spec, without_data
from andrea_jax.model import ModelConfig, Transformer


@dataclasses.dataclass(frozen=True)
class TrainSpec:
  """The ``train`` section, validated: how long the run is, what it writes and when."""
  num_steps: int           # optimizer steps of the run (the schedules are laid out over them)
  stop_step: int           # 0, or the step this call stops at (a first part of the run)
  log_every: int           # steps between metric reads and log records
  checkpoint_every: int    # steps between checkpoints (0: at the end and on signals only)
  keep_checkpoints: int    # newest checkpoints kept
  keep_period: int         # also keep every checkpoint at a multiple of this (0: none)
  progress_bar: bool
  plot: bool               # summary.png at the end
  tensorboard: bool        # TensorBoard event files beside metrics.jsonl
  hooks: tuple[hooks_lib.Hook, ...] = ()   # train.hooks: periodic work of the user's own


@dataclasses.dataclass(frozen=True)
class EvalSpec:
  """The ``eval`` section, validated (the target is :attr:`Run.target`)."""
  every: int               # steps between evaluations (0: at the end only)
  sequences_per_source: int
  prompts: tuple[str, ...]
  sample_tokens: int       # 0: no samples
  temperature: float
  top_k: int               # 0: the whole vocabulary
  metrics: tuple[Callable, ...] = ()   # eval.metrics: factories of the user's own metrics


@dataclasses.dataclass(frozen=True)
class Run:
  """The validated, static description of a run: everything below the command line reads this,
  never the ``ConfigDict`` (kept in :attr:`record` only to be written down).

  One field per section: ``model`` (the frozen :class:`~andrea_jax.model.ModelConfig`), ``step``
  (what the jitted step binds in: :class:`~andrea_jax.step.StepConfig`, with the curriculum and
  the detector, also reachable as :attr:`curriculum` and :attr:`cliff`), ``optim``, ``train``,
  ``eval``, ``data`` (the :class:`~andrea_jax.data.DataSpec`: the tokenizer, loaded, and each
  source's typed spec), ``mesh``; then the run's sources and its target.
  """
  model: ModelConfig
  step: step_lib.StepConfig
  optim: optim.OptimSpec
  train: TrainSpec
  eval: EvalSpec
  data: DataSpec
  mesh: sharding.MeshSpec
  sources: tuple[str, ...]
  trainable: tuple[str, ...]      # the sources some geometry lets the run sample
  evaluated: tuple[str, ...]      # those and eval.untrained: the sources with a held-out loss
  target: tuple[float, ...] | None = None   # eval.target normalised, one weight per source
  seed: int = 0
  init: pretrained.InitSpec | None = None   # the weights the run starts from (none: random)
  record: dict = dataclasses.field(default_factory=dict, compare=False)   # config.to_dict()

  @property
  def curriculum(self) -> curriculum.CurriculumSpec:
    """The curriculum's static tables and mixers (``step.curriculum``)."""
    return self.step.curriculum

  @property
  def cliff(self) -> cliff_lib.CliffConfig:
    """The zombie-cliff detector's settings (``step.cliff``)."""
    return self.step.cliff

  @property
  def config_json(self) -> str:
    """The configuration as it ran, for ``config.json`` (sorted keys, indented)."""
    return ml_collections.ConfigDict(self.record).to_json_best_effort(indent=2, sort_keys=True)


def _integer(section: str, cfg, name: str, minimum: int = 1) -> int:
  return checks.integer(f"{section}.{name}", cfg[name], minimum=minimum)


def validate_train_config(cfg: ml_collections.ConfigDict) -> None:
  num_steps = _integer("train", cfg, "num_steps")
  stop = _integer("train", cfg, "stop_step", minimum=0)
  if stop > num_steps:
    raise ValueError(f"train.stop_step = {stop} is past train.num_steps = {num_steps} (0 runs to "
                     "num_steps; the schedules are laid out over num_steps)")
  _integer("train", cfg, "log_every")
  _integer("train", cfg, "checkpoint_every", minimum=0)
  _integer("train", cfg, "keep_checkpoints")
  _integer("train", cfg, "keep_period", minimum=0)
  _integer("train", cfg, "max_nonfinite_steps")
  for name in ("progress_bar", "plot", "tensorboard", "document_mask"):
    checks.flag(f"train.{name}", cfg[name])


def _named(where: str, value, what: str) -> list[tuple[str, Any]]:
  """``(name, object)`` of each comma-separated ``"package.module:name"`` of ``value``."""
  names = [n.strip() for n in checks.text(where, value).split(",") if n.strip()]
  return [(n, plugins.resolve(f"{where} = {n!r}", n, {}, what)) for n in names]


def user_hooks(value) -> tuple[hooks_lib.Hook, ...]:
  """``train.hooks``: each named object a :class:`andrea_jax.hooks.Hook`, or a function of no
  arguments returning one; errors name ``train.hooks`` and the name."""
  out = []
  for name, found in _named("train.hooks", value, "hook"):
    try:
      hook = found if isinstance(found, hooks_lib.Hook) else found() if callable(found) else None
    except TypeError as e:   # a function of the step (a hook's fn) named instead of the Hook
      raise ValueError(f"train.hooks = {name!r}: calling it with no arguments failed ({e}); name "
                       "a Hook(every, fn), or a function of no arguments that returns one") from None
    if not isinstance(hook, hooks_lib.Hook) or not callable(hook.fn):
      raise ValueError(f"train.hooks = {name!r}: not a Hook(every, fn) nor a function returning "
                       f"one (got {type(hook).__name__})")
    checks.integer(f"train.hooks = {name!r}: its every", hook.every, minimum=0)
    out.append(hook)
  return tuple(out)


def user_metrics(value) -> tuple[Callable, ...]:
  """``eval.metrics``: each named object a factory ``(EvalContext) -> metric(params, step)``."""
  out = []
  for name, found in _named("eval.metrics", value, "metric"):
    if not callable(found):
      raise ValueError(f"eval.metrics = {name!r}: not a function of the evaluation's context")
    out.append(found)
  return tuple(out)


def validate_eval_config(cfg: ml_collections.ConfigDict) -> None:
  _integer("eval", cfg, "every", minimum=0)
  _integer("eval", cfg, "sequences_per_source")
  _integer("eval", cfg, "sample_tokens", minimum=0)
  _integer("eval", cfg, "top_k", minimum=0)
  checks.number("eval.temperature", cfg.temperature, low=0, low_open=True)
  if (not isinstance(cfg.prompts, (list, tuple))
      or not all(isinstance(p, str) and p for p in cfg.prompts)):
    raise TypeError(f"eval.prompts must be a list of non-empty strings, got {cfg.prompts!r}")


def untrained_sources(cfg: ml_collections.ConfigDict, sources: tuple[str, ...]
                      ) -> tuple[str, ...]:
  """``eval.untrained`` (comma-separated names) as a tuple in source order: the sources the run
  evaluates and never trains on; a ``ValueError`` names an unknown one."""
  given = [n.strip() for n in checks.text("eval.untrained", cfg.untrained).split(",") if n.strip()]
  unknown = [n for n in given if n not in sources]
  if unknown:
    raise ValueError(f"unknown source {unknown[0]!r} in eval.untrained; known sources are: "
                     f"{', '.join(sources)}")
  return tuple(s for s in sources if s in given)


def eval_target(cfg: ml_collections.ConfigDict, sources: tuple[str, ...],
                used: tuple[str, ...]) -> tuple[float, ...] | None:
  """``eval.target`` normalised, one weight per source (``None`` when every weight is 0); a
  ``ValueError`` for an unknown name, a weight that is not a finite number >= 0, or weight on a
  source the run does not evaluate (``used``: the sources some geometry samples and those of
  ``eval.untrained``; the others have no held-out loss)."""
  keys = {sources_lib.source_key(s): s for s in sources}
  given = dict(cfg.target)
  unknown = sorted(set(given) - set(keys))
  if unknown:
    raise ValueError(f"eval.target names {unknown}, not sources of the run ({list(keys)})")
  w_S = []
  for key, name in keys.items():
    w = checks.number(f"eval.target.{key}", given.get(key, 0.0), low=0)
    if w and name not in used:
      raise ValueError(f"eval.target.{key} = {w} weighs a source the run does not evaluate: no "
                       "geometry lets the run sample it (it has no held-out loss); list it in "
                       "eval.untrained to evaluate it without training on it")
    w_S.append(float(w))
  total = sum(w_S)
  return tuple(w / total for w in w_S) if total else None


def model_config(config: ml_collections.ConfigDict, vocab_size: int | None = None) -> ModelConfig:
  """The frozen ``ModelConfig``; ``model.vocab_size = 0`` takes ``vocab_size`` (the tokenizer's).

  An explicit ``model.vocab_size`` below the tokenizer's is refused: larger ids would index past the
  embedding table (and turn the loss into NaN).
  """
  fields = config.model.to_dict()
  v = fields.get("vocab_size")
  if type(v) is int and v >= 0:   # other values are ModelConfig's to reject
    tokenizer_vocab = vocab_size if vocab_size else _tokenizer_vocab(config.data.tokenizer)
    if v == 0:
      fields["vocab_size"] = tokenizer_vocab
    elif v < tokenizer_vocab:
      raise ValueError(f"model.vocab_size = {v} is smaller than the {tokenizer_vocab} ids of "
                       f"data.tokenizer = {config.data.tokenizer!r} (0 takes the tokenizer's size)")
  return ModelConfig.from_dict(fields)


def _check_sampling(cfg: ml_collections.ConfigDict, tok, mcfg: ModelConfig) -> None:
  """The evaluation's samples fit the model, checked now rather than after training: ``top_k``
  within the vocabulary, each prompt (after the end-of-document id) plus ``sample_tokens`` within
  ``model.max_len``."""
  if cfg.top_k > mcfg.vocab_size:
    raise ValueError(f"eval.top_k = {cfg.top_k} exceeds the vocabulary ({mcfg.vocab_size} ids; "
                     "0 samples from all of them)")
  if not cfg.sample_tokens or not cfg.prompts:   # no samples drawn
    return
  ids = min(mcfg.vocab_size, tok.vocab_size)   # samples are drawn among the tokenizer's ids
  if cfg.top_k > ids:
    raise ValueError(f"eval.top_k = {cfg.top_k} exceeds the vocabulary ({ids} ids; "
                     "0 samples from all of them)")
  longest = max(cfg.prompts, key=lambda p: len(tok.encode(p)))
  need = 1 + len(tok.encode(longest)) + cfg.sample_tokens
  if need > mcfg.max_len:
    raise ValueError(f"eval.sample_tokens = {cfg.sample_tokens} with the prompt {longest!r} "
                     f"({need - cfg.sample_tokens} tokens with the end-of-document id) needs "
                     f"{need} positions, more than model.max_len = {mcfg.max_len}; lower "
                     "eval.sample_tokens (0 turns samples off)")


def _check_signals(spec: curriculum.CurriculumSpec, run_probes) -> None:
  """Every signal a mixer reads is measured by one of the run's probes (before anything
  compiles): the error names the mixer, the signal and the probe to turn on."""
  measured = {p.name for p in run_probes}
  for (name, args), mixer in zip(spec.mixer_set.keys, spec.mixers):
    reward = dict(args).get("reward") if isinstance(args, tuple) else None
    for signal in mixer.signals:
      if signal not in measured and reward == signal and signal not in rewards_lib.BUILTIN:
        raise ValueError(
            f"curriculum.mixer.reward = {signal!r} is neither a built-in reward "
            f"({', '.join(rewards_lib.BUILTIN)}) nor a probe of this run (probes: "
            f"{', '.join(sorted(measured)) or 'none measure'}), nor 'package.module:factory'")
      if signal not in measured:
        where = ("curriculum.mixer" if mixer is spec.mixer else f"the mixer {name!r}")
        raise ValueError(
            f"{where} reads the signal {signal!r}, which the run does not measure: set "
            f"probes.{signal}.every > 0" + (" (and eval.target)" if signal == "target_gain"
                                            else f" (or add a probe named {signal!r})"))


def _tokenizer_vocab(spec: str) -> int:
  from andrea_jax import data as data_lib
  return data_lib.load_tokenizer(spec).vocab_size


def _mesh(config: ml_collections.ConfigDict, data: DataSpec, accum: int
          ) -> tuple[sharding.MeshSpec, int]:
  """The mesh section, and the devices every micro-batch is split over (the batch checked)."""
  held = collections.Counter(d.process_index for d in jax.devices())
  if len(set(held.values())) > 1:
    # Each process builds an equal slice of the global batch (data.MixtureSampler); every process
    # sees the same device list, so all of them refuse together.
    raise ValueError(f"the processes hold unequal numbers of devices "
                     f"({', '.join(f'process {p}: {n}' for p, n in sorted(held.items()))}): every "
                     "process must hold as many as the others (distributed.local_device_ids)")
  mesh = sharding.MeshSpec.from_config(config.mesh)
  replicas, fsdp = sharding.mesh_shape(mesh, jax.device_count())
  batch, devices = data.global_batch_size, replicas * fsdp
  if batch % (accum * devices):
    # Every micro-batch is split over every device: B = accum x devices x (rows per device).
    raise ValueError(
        f"data.global_batch_size = {batch} is not a multiple of optim.grad_accum_steps x devices = "
        f"{accum} x {devices} (mesh.data x mesh.fsdp = {replicas} x {fsdp}): each of the {accum} "
        f"micro-batches must give every device whole rows")
  return mesh, devices


def _curriculum(config: ml_collections.ConfigDict, data: DataSpec, sources: tuple[str, ...]
                ) -> tuple[curriculum.CurriculumSpec, tuple[str, ...], tuple[str, ...]]:
  """The curriculum's spec, the sources it trains on and the sources the run evaluates (those
  and ``eval.untrained``), each with data."""
  untrained = untrained_sources(config.eval, sources)
  spec = curriculum.spec_from_config(config.curriculum, sources=sources, untrained=untrained)
  trainable = curriculum.used_sources(spec)
  evaluated = tuple(s for s in sources if s in trainable or s in untrained)
  empty = without_data(data, evaluated)
  if empty:   # before anything is read, every source at once
    raise ValueError(
        f"no data for the sources {empty}: set data.files.<source>.paths (files) or .format='hf' "
        f"with .dataset (a Hugging Face dataset) for "
        f"{', '.join(sources_lib.source_key(s) for s in empty)}, or give them a ceiling of 0 in "
        "every geometry (and leave them out of eval.untrained)")
  num_steps = config.train.num_steps
  late = [f"{name} ({start})" for name, start in zip(spec.geometry_names, spec.starts.tolist())
          if start >= num_steps]
  if late:   # e.g. train.num_steps overridden without the start steps laid out for the old length
    warnings.warn(f"curriculum geometries {', '.join(late)} start at or after train.num_steps = "
                  f"{num_steps}: they never come into force", stacklevel=3)
  return spec, trainable, evaluated


def build(config: ml_collections.ConfigDict) -> Run:
  """Validate ``config`` and build the run's static pieces; raises ``ValueError``/``TypeError``."""
  seed = checks.integer("seed", config.seed, minimum=0)
  sources = sources_lib.check_sources(config.sources)
  validate_train_config(config.train)
  validate_eval_config(config.eval)
  data = data_spec(config.data, sources)   # the tokenizer loaded once, here
  num_steps = config.train.num_steps
  optim_spec = optim.OptimSpec.from_config(config.optim, num_steps)
  mcfg = model_config(config, data.tokenizer.vocab_size)
  if data.seq_len > mcfg.max_len:
    raise ValueError(f"data.seq_len = {data.seq_len} exceeds model.max_len = {mcfg.max_len}")
  _check_sampling(config.eval, data.tokenizer, mcfg)
  accum = optim_spec.grad_accum_steps
  mesh, devices = _mesh(config, data, accum)
  spec, trainable, evaluated = _curriculum(config, data, sources)
  target = eval_target(config.eval, sources, evaluated)
  run_probes = probes_lib.build(config.probes, probes_lib.ProbeEnv(
      name="", sources=sources, trainable=tuple(s in trainable for s in sources),
      evaluated=tuple(s in evaluated for s in sources), target=target, optim=optim_spec,
      devices=devices))
  _check_signals(spec, run_probes)
  step_cfg = step_lib.StepConfig(
      model=Transformer(mcfg), tx=optim_spec.transform(), schedule=optim_spec.learning_rate(),
      curriculum=spec, cliff=cliff_lib.CliffConfig.from_config(config.cliff),
      num_sources=len(sources), grad_accum_steps=accum,
      max_nonfinite_steps=config.train.max_nonfinite_steps,
      document_mask=config.train.document_mask, probes=run_probes)
  t, e = config.train, config.eval
  return Run(model=mcfg, step=step_cfg, optim=optim_spec,
             train=TrainSpec(num_steps=t.num_steps, stop_step=t.stop_step, log_every=t.log_every,
                             checkpoint_every=t.checkpoint_every,
                             keep_checkpoints=t.keep_checkpoints, keep_period=t.keep_period,
                             progress_bar=t.progress_bar, plot=t.plot, tensorboard=t.tensorboard,
                             hooks=user_hooks(t.hooks)),
             eval=EvalSpec(every=e.every, sequences_per_source=e.sequences_per_source,
                           prompts=tuple(e.prompts), sample_tokens=e.sample_tokens,
                           temperature=float(e.temperature), top_k=e.top_k,
                           metrics=user_metrics(e.metrics)),
             data=dataclasses.replace(data, micro_batch_size=data.global_batch_size // accum),
             mesh=mesh, sources=sources, trainable=trainable, evaluated=evaluated, target=target,
             seed=seed, init=pretrained.init_spec(config.get("init")),
             record=config.to_dict())
