"""What an ablation varies: per-variant hyper-parameters, validated, and the run they belong to.

A *variant* is a dict with any of :data:`VARIANT_FIELDS`; the fields it leaves out take the config's
value. Everything else (model shape, batch, data, weight decay, schedule kind) is shared by all the
variants of one ablation, which is what lets them train in one vmapped program:

* ``seed``: the parameter initialisation, ``train.run_keys(seed)["params"]`` -- the same parameters a
  normal run with ``config.seed = seed`` starts from. The batches do not depend on it: every variant
  sees the same batches (drawn with ``config.seed``), so differences between variants come from
  the initialisation and the optimizer alone;
* ``warmup_steps``: the linear learning-rate warmup (0 = v1, the first step at the peak rate);
* ``peak_lr``: the rate at the end of the warmup;
* ``init_std``: the standard deviation of the initialisation (``ModelConfig.init_std``); it only
  changes the starting point, never the forward pass, so it too can vary across one program.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import ml_collections
import numpy as np

from andrea_jax import checks, optim

VARIANT_FIELDS = ("seed", "warmup_steps", "peak_lr", "init_std")


@dataclasses.dataclass(frozen=True)
class Variant:
  """One fully specified variant (every field set)."""
  seed: int
  warmup_steps: int
  peak_lr: float
  init_std: float

  @property
  def label(self) -> str:
    """``"seed=0 warmup=20 lr=0.003 init=0.02"``."""
    return (f"seed={self.seed} warmup={self.warmup_steps} lr={self.peak_lr:g} "
            f"init={self.init_std:g}")

  def to_dict(self) -> dict[str, Any]:
    return dataclasses.asdict(self)


def resolve_variants(config: ml_collections.ConfigDict, variants: list[dict[str, Any]],
                     num_steps: int) -> list[Variant]:
  """Fills each variant's missing fields from ``config`` and validates all of them.

  Raises ``ValueError``/``TypeError`` naming the variant index, the field and the value.

  Example:
    >>> resolve_variants(config, [{"warmup_steps": 0}, {"warmup_steps": 20, "seed": 1}], 200)
    [Variant(seed=0, warmup_steps=0, ...), Variant(seed=1, warmup_steps=20, ...)]
  """
  if isinstance(variants, dict) or not isinstance(variants, (list, tuple)) or not variants:
    raise ValueError(f"variants must be a non-empty list of dicts, got {variants!r}")
  defaults = {"seed": config.seed, "warmup_steps": config.optim.warmup_steps,
              "peak_lr": config.optim.peak_lr, "init_std": config.model.init_std}
  out = []
  for i, v in enumerate(variants):
    if not isinstance(v, dict):
      raise TypeError(f"variants[{i}] must be a dict, got {v!r}")
    unknown = sorted(set(v) - set(VARIANT_FIELDS))
    if unknown:
      raise ValueError(f"variants[{i}] has unknown field(s) {unknown}; an ablation varies only "
                       f"{list(VARIANT_FIELDS)} (anything else changes the program: run it "
                       "separately)")
    f = {**defaults, **v}
    seed, warmup, lr, std = f["seed"], f["warmup_steps"], f["peak_lr"], f["init_std"]
    # numpy numbers count (np.arange of warmups is the usual way to write a sweep).
    seed = checks.integer(f"variants[{i}].seed", seed, minimum=0)   # and below 2**31
    given = "" if "warmup_steps" in v else "; optim.warmup_steps: the variant sets none"
    warmup = checks.integer(f"variants[{i}].warmup_steps", warmup, minimum=0, maximum=num_steps,
                            hint=f"num_steps = {num_steps}{given}")
    try:   # the same rule the trainer applies to one run: a wsd decay must fit after the warmup
      optim.check_wsd_fits(config.optim, warmup, num_steps, field=f"variants[{i}].warmup_steps")
    except ValueError as e:
      raise ValueError(str(e)) from None
    f32 = np.finfo(np.float32)   # the step's precision: past it the value is inf or 0
    lo, hi = float(f32.tiny), float(f32.max)
    rates = {}
    for name, x in (("peak_lr", lr), ("init_std", std)):
      field = f"variants[{i}].{name}"
      rates[name] = checks.satisfies(field, checks.number(field, x, low=0, low_open=True),
                                     lambda x: lo <= x <= hi,
                                     f"within float32's normal range [{lo:.4g}, {hi:.4g}]",
                                     hint="the precision the step runs in")
    out.append(Variant(seed=seed, warmup_steps=warmup, **rates))
  return out


def run_config(config: ml_collections.ConfigDict, num_steps: int,
               variant: Variant | None = None) -> ml_collections.ConfigDict:
  """A copy of ``config`` for ``num_steps`` steps, with ``variant``'s fields written in if given.

  Without a variant the optimizer's warmup is clipped to the run (each variant brings its own).
  """
  c = config.copy_and_resolve_references()
  c.train.num_steps = num_steps
  # The ablation vmaps the step over variants, and jax's batching rule for cuDNN's fused attention
  # mishandles a mask under vmap (a bias of the wrong batch): XLA attention, the same numbers.
  c.model.attention_impl = "xla"
  if variant is None:
    c.optim.warmup_steps = min(c.optim.warmup_steps, num_steps)
  else:
    c.seed = variant.seed
    c.optim.warmup_steps = variant.warmup_steps
    c.optim.peak_lr = variant.peak_lr
    c.model.init_std = variant.init_std
  return c
