"""The probe interface: a measurement inside the jitted step, with a cadence and rows of its own.

A :class:`Probe` is levanter's ``JitCallback`` shaped for a mixing curriculum. On the host,
``draw`` gives the rows of its measurement steps (from the run's data, on sampler streams of its
own); inside the step, ``measure`` turns them and the state the step starts from into one number
per source, ``[S]`` float32, under ``lax.cond`` (nothing is computed on the other steps, where the
signal is NaN). The step hands every probe's signal to the curriculum's mixers in
``Observation.signals`` and to the logs as ``<name>/<source>``.

Rows travel in the training batch under ``probes/<name>/<group>/<key>`` (:func:`rows_key`), one
group per kind of rows a probe needs (the target gain's ``probe`` and ``target``), each with a
fixed number of global rows (``Probe.rows``) so that the step compiles once: at the steps that do
not measure, the host sends zero rows of the same shapes, which count no token.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import jax
import numpy as np

PyTree = Any
Batch = dict[str, Any]
MakeSampler = Callable[..., Any]
"""``make(global_batch_size=..., seed=..., split="train")``: a sampler of this process's rows of a
global batch (:class:`andrea_jax.data.MixtureSampler`), with ``.batch(step, weights_S)``."""

PREFIX = "probes/"


class ProbeEnv(NamedTuple):
  """What a probe's factory knows of the run when it is built (``factory(env, **fields)``).

  Attributes:
    name: the probe's name (its section's key, ``probes.<name>``): its signal's name.
    sources: the run's sources, the order of every ``[S]`` vector.
    trainable: ``[S]`` bool as a tuple, the sources some geometry lets the run sample.
    evaluated: ``[S]`` bool, the sources the run evaluates (the trainable ones and
      ``eval.untrained``); they have held-out data.
    target: ``eval.target`` normalised, one weight per source (``None``: no target declared).
    optim: the run's :class:`andrea_jax.optim.OptimSpec` (Adam's ``eps`` and ``b2``, say).
    devices: the devices a row group is split over: every group's rows must be a multiple.
  """
  name: str
  sources: tuple[str, ...]
  trainable: tuple[bool, ...]
  evaluated: tuple[bool, ...]
  target: tuple[float, ...] | None
  optim: Any
  devices: int = 1

  @property
  def where(self) -> str:
    """The probe's section, for error messages: ``probes.<name>``."""
    return f"probes.{self.name}"


class At(NamedTuple):
  """The state a measurement sees: the weights and optimizer state the step starts from."""
  step: jax.Array
  params: PyTree
  opt_state: PyTree


class ProbeContext(NamedTuple):
  """What the training step lends a measurement (built by :mod:`andrea_jax.step`).

  Attributes:
    num_sources: ``S``.
    token_losses: ``(params, rows) -> (loss [B, T], counted [B, T])``, the training loss of every
      token (the run's model and attention, the fused loss), 0 where a token does not count.
    forward_token_losses: the same function through plain XLA attention, which forward-mode
      differentiation (``jax.jvp``) can go through.
  """
  num_sources: int
  token_losses: Callable[[PyTree, Batch], tuple[jax.Array, jax.Array]]
  forward_token_losses: Callable[[PyTree, Batch], tuple[jax.Array, jax.Array]]

  def per_source(self, loss_BxT: jax.Array, counted_BxT: jax.Array, source_ids_B: jax.Array
                 ) -> tuple[jax.Array, jax.Array]:
    """Mean loss and counted tokens per source, ``([S], [S])`` (mean 0 where no token counts)."""
    loss_S = jax.ops.segment_sum(loss_BxT.sum(-1), source_ids_B, num_segments=self.num_sources)
    tokens_S = jax.ops.segment_sum(counted_BxT.sum(-1), source_ids_B,
                                   num_segments=self.num_sources)
    return loss_S / jax.numpy.maximum(tokens_S, 1.0), tokens_S


class Probe(NamedTuple):
  """A per-source measurement made inside the training step (every function but ``draw``'s
  result jittable).

  Attributes:
    every: steps between measurements (> 0): the steps ``t`` with ``(t + 1) % every == 0``
      (:func:`is_due`: after ``every - 1`` updates, and at every log step when ``every`` divides
      ``train.log_every``).
    rows: ``{group: global rows}`` of a measurement, each a multiple of the devices.
    draw: host side, ``make_sampler -> (step -> {group: rows})``: this process's rows of each
      group at measuring step ``step`` (a pure function of the run's seed and the step, so a
      resumed run measures on the same rows).
    measure: device side, ``(ProbeContext, At, {group: rows}) -> [S]`` float32 (NaN where it
      measures nothing), traced once.
    name: the probe's name, set by the run from its section's key.
  """
  every: int
  rows: Mapping[str, int]
  draw: Callable[[MakeSampler], Callable[[int], Mapping[str, Batch]]]
  measure: Callable[[ProbeContext, At, Mapping[str, Batch]], jax.Array]
  name: str = ""


def is_due(step, every: int):
  """Whether step ``step`` (an int or a traced int) measures: ``(step + 1) % every == 0``.

  Example: ``[t for t in range(12) if is_due(t, 4)] == [3, 7, 11]``.
  """
  return (step + 1) % every == 0


def rows_key(name: str, group: str, key: str) -> str:
  """The batch key of one array of a probe's rows: ``probes/<name>/<group>/<key>``."""
  return f"{PREFIX}{name}/{group}/{key}"


def split(batch: Batch) -> tuple[Batch, dict[str, dict[str, Batch]]]:
  """A training batch's own rows, and each probe's rows by name and group.

  Example:
    >>> own, rows = split({"inputs": x, "probes/target_gain/probe/inputs": y})
    >>> rows["target_gain"]["probe"]["inputs"] is y
    True
  """
  own: Batch = {}
  rows: dict[str, dict[str, Batch]] = {}
  for key, value in batch.items():
    if not key.startswith(PREFIX):
      own[key] = value
      continue
    name, group, field = key[len(PREFIX):].split("/", 2)
    rows.setdefault(name, {}).setdefault(group, {})[field] = value
  return own, rows


class HostRows:
  """Host side of a run's probes: the rows every probe adds to the batch of step ``t``, this
  process's slice (zero rows of the same shapes at the steps a probe does not measure)."""

  def __init__(self, probes: tuple[Probe, ...], make_sampler: MakeSampler):
    self.probes = probes
    self._draws = [p.draw(make_sampler) for p in probes]
    self._zeros: dict[str, Mapping[str, Batch]] = {}

  def rows(self, step: int) -> dict[str, tuple[int, Batch]]:
    """``{rows_key(...): (global rows of its group, array)}`` of step ``step``."""
    out = {}
    for probe, draw in zip(self.probes, self._draws):
      if is_due(step, probe.every):
        groups = draw(step)
      else:
        if probe.name not in self._zeros:   # any step's shapes: the same at every step
          self._zeros[probe.name] = {g: {k: np.zeros_like(v) for k, v in b.items()}
                                     for g, b in draw(0).items()}
        groups = self._zeros[probe.name]
      for group, batch in groups.items():
        for key, value in batch.items():
          out[rows_key(probe.name, group, key)] = (probe.rows[group], value)
    return out
