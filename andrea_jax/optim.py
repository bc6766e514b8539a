"""The optimizer: global-norm clipping then AdamW, with a linear warmup and a decay.

ANDREA's two optimizer settings differ only in the warmup (SPEC §2):

* **v1**: ``warmup_steps = 0`` -- the very first update is taken at the peak rate 3e-4;
* **v2**: ``warmup_steps = 2000`` -- the rate ramps linearly from 0 to 3e-4 over 2000 steps.

After the warmup the rate decays by a cosine to ``min_lr_ratio * peak_lr`` at the end of the run (the
GPT-2 / nanoGPT / llm.c choice), or stays flat and decays linearly over the last ``decay_steps``
("wsd", warmup-stable-decay, which lets a run be extended without re-tuning the schedule).

The schedules are written with ``jnp`` rather than ``optax.join_schedules`` so that ``warmup_steps`` and
``peak_lr`` may be *traced* values: the warmup ablation vmaps one training program over several warmup
lengths. For static values they equal optax's own schedules (tested).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from andrea_jax import checks
from andrea_jax import plugins

SCHEDULES = ("cosine", "wsd", "constant")

Schedule = Callable[[jax.Array], jax.Array]


def warmup_decay(step: jax.Array, *, peak_lr, warmup_steps, total_steps: int, kind: str = "cosine",
                 min_lr_ratio: float = 0.1, decay_steps: int = 0) -> jax.Array:
  r"""Learning rate at ``step`` (float32 scalar); ``peak_lr`` and ``warmup_steps`` may be traced.

  .. math::
     \eta(t) = \begin{cases}
       \eta_{peak}\, t / t_w & t < t_w \\
       \eta_{min} + (\eta_{peak} - \eta_{min}) \tfrac12 (1 + \cos \pi p) & \text{cosine},\ p = \frac{t - t_w}{T - t_w} \\
       \eta_{peak} \text{ then linear to } \eta_{min} \text{ over the last } t_d \text{ steps} & \text{wsd}
     \end{cases}

  with :math:`\eta_{min} = r\,\eta_{peak}`. ``warmup_steps = 0`` gives the peak rate at step 0 (v1).

  Example: ``warmup_decay(0, peak_lr=3e-4, warmup_steps=2000, total_steps=200_000) == 0``.
  """
  step = jnp.asarray(step, jnp.float32)
  peak = jnp.asarray(peak_lr, jnp.float32)
  tw = jnp.asarray(warmup_steps, jnp.float32)
  lo = min_lr_ratio * peak
  warm = peak * step / jnp.maximum(tw, 1.0)
  if kind == "cosine":
    p = jnp.clip((step - tw) / jnp.maximum(total_steps - tw, 1.0), 0.0, 1.0)
    after = lo + (peak - lo) * 0.5 * (1.0 + jnp.cos(jnp.pi * p))
  elif kind == "wsd":
    td = float(wsd_decay_steps(decay_steps, total_steps))
    p = jnp.clip((step - (total_steps - td)) / td, 0.0, 1.0)
    after = peak + (lo - peak) * p
  elif kind == "constant":
    after = peak
  else:
    raise ValueError(f"optim.schedule must be one of {SCHEDULES}, got {kind!r}")
  return jnp.where(step < tw, warm, after)


def wsd_decay_steps(decay_steps: int, total_steps: int) -> int:
  """The wsd schedule's decay length: ``decay_steps``, or 20% of the run when it is 0."""
  return int(decay_steps) if decay_steps > 0 else max(1, round(0.2 * total_steps))


def decay_mask(params):
  """True for the leaves weight decay applies to: matrices (ndim >= 2); not biases nor LayerNorm."""
  return jax.tree.map(lambda p: p.ndim >= 2, params)


def clip_by_global_norm(max_norm: float) -> optax.GradientTransformationExtraArgs:
  r"""``optax.clip_by_global_norm`` that can take the norm from its caller.

  .. math:: g \leftarrow g \quad \text{if } \|g\| < c, \qquad
            g \leftarrow \frac{g}{\|g\|}\, c \quad \text{otherwise}

  with :math:`\|g\|` the global norm over every leaf, the same arithmetic as optax's (and the same
  empty state, so checkpoints do not change). ``update(grads, state, params, grad_norm=n)`` uses
  ``n`` instead of computing the norm again: the train step has just computed it for its metric,
  and the norm is a full read of the gradient. Without ``grad_norm`` it computes it, as optax does.

  Example:
    >>> tx = optax.chain(clip_by_global_norm(1.0), optax.adamw(3e-4))
    >>> updates, state = tx.update(grads, state, params, grad_norm=optax.tree.norm(grads))
  """
  def update_fn(updates, state, params=None, *, grad_norm=None, **extra_args):
    del params, extra_args
    g_norm = optax.tree.norm(updates) if grad_norm is None else grad_norm
    trigger = jnp.squeeze(g_norm < max_norm)
    clip = lambda t: jax.lax.select(trigger, t, (t / g_norm.astype(t.dtype)) * max_norm)
    return jax.tree.map(clip, updates), state
  return optax.GradientTransformationExtraArgs(optax.init_empty_state, update_fn)


def adamw(spec: "OptimSpec", learning_rate: Schedule) -> optax.GradientTransformation:
  """The built-in update (``optim.name = "adamw"``): AdamW with ``spec``'s betas, epsilon and
  decoupled weight decay on matrices only (:func:`decay_mask`)."""
  return optax.adamw(learning_rate=learning_rate, b1=spec.b1, b2=spec.b2, eps=spec.eps,
                     weight_decay=spec.weight_decay, mask=decay_mask)


BUILTIN = {"adamw": adamw}
"""The built-in updates by name (``optim.name``); ``"package.module:factory"`` names one's own, a
function ``(OptimSpec, learning_rate) -> optax.GradientTransformation``."""


@dataclasses.dataclass(frozen=True)
class OptimSpec:
  """The ``optim`` section, validated (:meth:`from_config`): clipping, AdamW and the schedule.

  Everything that reads the optimizer's settings reads this object: the trainer builds its
  transformation with :meth:`transform`, the warmup ablation with traced rates through
  :meth:`learning_rate`, and the target gain takes Adam's ``eps`` and ``b2`` from it. Field
  meanings and units: :func:`andrea_jax.config.optim_section`.
  """
  peak_lr: float
  warmup_steps: int
  schedule: str            # the decay after the warmup: one of SCHEDULES
  decay_steps: int
  min_lr_ratio: float
  b1: float
  b2: float
  eps: float
  weight_decay: float
  grad_clip: float
  grad_accum_steps: int
  total_steps: int         # the run's length (train.num_steps): the schedule is laid out over it
  name: str = "adamw"      # the update after the clipping: a built-in or "package.module:factory"

  @classmethod
  def from_config(cls, cfg: ml_collections.ConfigDict, total_steps: int) -> "OptimSpec":
    """The section checked, every error naming ``optim.<field>`` and the value."""
    validate_optim_config(cfg, total_steps)
    fields = {f.name: cfg[f.name] for f in dataclasses.fields(cls)
              if f.name not in ("total_steps", "name")}
    name = cfg.get("name", "adamw")
    update(name)   # refused now, naming optim.name, when it names nothing usable
    return cls(**fields, total_steps=int(total_steps), name=name)

  def learning_rate(self, *, peak_lr=None, warmup_steps=None) -> Schedule:
    """The schedule ``step -> lr`` (:func:`warmup_decay`); ``peak_lr`` and ``warmup_steps``
    replace the section's and may be traced (the warmup ablation vmaps over them)."""
    peak = self.peak_lr if peak_lr is None else peak_lr
    warmup = self.warmup_steps if warmup_steps is None else warmup_steps
    return lambda step: warmup_decay(
        step, peak_lr=peak, warmup_steps=warmup, total_steps=self.total_steps,
        kind=self.schedule, min_lr_ratio=self.min_lr_ratio, decay_steps=self.decay_steps)

  def transform(self, schedule: Schedule | None = None) -> optax.GradientTransformationExtraArgs:
    """``optax.chain(clip_by_global_norm, <update>)`` with ``schedule`` (default
    :meth:`learning_rate`), the update the one ``optim.name`` names (AdamW by default). The
    clipping is :func:`clip_by_global_norm`: ``update(..., grad_norm=n)`` hands it a norm already
    computed."""
    schedule = schedule or self.learning_rate()
    parts = []
    if self.grad_clip > 0:
      parts.append(clip_by_global_norm(self.grad_clip))
    parts.append(update(self.name)(self, schedule))
    return optax.chain(*parts)


def update(name: str) -> Callable[["OptimSpec", Schedule], optax.GradientTransformation]:
  """The update factory ``optim.name`` names: a built-in of :data:`BUILTIN` or
  ``"package.module:factory"``; a ``ValueError`` naming ``optim.name`` when it names nothing.

  Example: a Lion of one's own in ``myopt.py`` (``optim.name = "myopt:lion"``)::

    def lion(spec, learning_rate):
      return optax.lion(learning_rate, b1=spec.b1, b2=spec.b2, weight_decay=spec.weight_decay,
                        mask=decay_mask)
  """
  made = plugins.resolve(f"optim.name = {name!r}", name, BUILTIN, "update")
  if not callable(made):
    raise ValueError(f"optim.name = {name!r}: not a function (OptimSpec, learning_rate) -> "
                     "optax.GradientTransformation")
  return made


def validate_optim_config(cfg: ml_collections.ConfigDict, total_steps: int) -> None:
  """Reject a bad ``optim`` section, naming the field and the value (before anything compiles)."""
  for name in ("peak_lr", "min_lr_ratio", "b1", "b2", "eps", "weight_decay", "grad_clip"):
    checks.number(f"optim.{name}", cfg[name])
  for name in ("warmup_steps", "decay_steps"):
    checks.integer(f"optim.{name}", cfg[name], minimum=0)
  checks.number("optim.peak_lr", cfg.peak_lr, low=0, low_open=True)
  checks.number("optim.min_lr_ratio", cfg.min_lr_ratio, low=0, high=1)
  for name in ("b1", "b2"):
    checks.number(f"optim.{name}", cfg[name], low=0, high=1, high_open=True)
  checks.number("optim.eps", cfg.eps, low=0, low_open=True)
  for name in ("weight_decay", "grad_clip"):
    checks.number(f"optim.{name}", cfg[name], low=0)
  check_float32(cfg)
  checks.integer("optim.grad_accum_steps", cfg.grad_accum_steps, minimum=1)
  checks.choice("optim.schedule", cfg.schedule, SCHEDULES)
  if cfg.warmup_steps > total_steps:
    raise ValueError(f"optim.warmup_steps = {cfg.warmup_steps} is longer than the run "
                     f"(train.num_steps = {total_steps})")
  check_wsd_fits(cfg, cfg.warmup_steps, total_steps)


def check_float32(cfg: ml_collections.ConfigDict, prefix: str = "optim") -> None:
  """Reject values that float32, the precision the step runs in, cannot hold: past its largest
  number (an infinite rate), ``b1``/``b2`` that round to 1 (Adam's bias correction divides by 0), an
  ``eps`` or ``peak_lr`` below its smallest normal number (flushed to 0: 0 / 0 in Adam, or a rate
  of 0). Each of them would put NaN in the weights, or train nothing, without another error."""
  f32 = np.finfo(np.float32)
  for name in ("peak_lr", "weight_decay", "grad_clip", "eps"):
    if abs(cfg[name]) > f32.max:
      raise ValueError(f"{prefix}.{name} = {cfg[name]!r} overflows float32 (largest "
                       f"{float(f32.max):.4g}), the precision the step runs in")
  for name in ("peak_lr", "eps"):
    if cfg[name] < f32.tiny:
      raise ValueError(f"{prefix}.{name} = {cfg[name]!r} is below float32's smallest normal "
                       f"number ({float(f32.tiny):.4g}): the step, in float32, would read it as 0")
  for name in ("b1", "b2"):
    if np.float32(cfg[name]) >= 1:
      raise ValueError(f"{prefix}.{name} = {cfg[name]!r} rounds to 1.0 in float32, the precision "
                       "the step runs in (Adam's bias correction would divide by 0): use at most "
                       f"{float(np.nextafter(np.float32(1), np.float32(0))):.8f}")


def check_wsd_fits(cfg: ml_collections.ConfigDict, warmup_steps: int, total_steps: int,
                   field: str = "optim.warmup_steps") -> None:
  """Under ``schedule = "wsd"``, ``ValueError`` unless the decay (``decay_steps``, 0 = 20% of the
  run) fits after a warmup of ``warmup_steps`` (``field`` names where that warmup came from)."""
  if cfg.schedule != "wsd":
    return
  td = wsd_decay_steps(cfg.decay_steps, total_steps)
  if td > total_steps - warmup_steps:
    given = (f"optim.decay_steps = {cfg.decay_steps}" if cfg.decay_steps > 0 else
             f"optim.decay_steps = 0 (the default: 20% of the run, {td} steps)")
    raise ValueError(f"{given} does not fit after the warmup ({field} = {warmup_steps}) in "
                     f"train.num_steps = {total_steps}")
