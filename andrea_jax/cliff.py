"""The zombie-cliff detector: a training loss that falls far below its recent distribution.

At step 112,080 ANDREA-120M's training loss fell to 0.13: a narrow ravine where a memorised
substring of ``repo-docs`` reaches near-zero loss. This module catches such steps inside the jitted
train step, names the source responsible, and (optionally) marks it for exclusion. A step costs
``O(W * S)`` elementwise work (``W`` = window, ``S`` = sources: the windows are kept sorted, so
medians are lookups) on a small pytree state, with no host synchronisation.

**The baseline.** Two choices (``CliffConfig.baseline``):

* ``"total"``: the window holds past total losses ``x_t = loss_t``; the expected loss is their
  median.
* ``"mixture"`` (default): the mixture changes every 7-42 steps and the sources' losses differ
  widely, so the total loss jumps between phases for no reason but the mixture, which widens its
  spread and hides cliffs. This baseline predicts the loss at this step's mixture, ``predicted =
  sum_s p_s median_s + (1 - sum_s p_s) median(loss_W)`` (the first sum over sources with a baseline
  of their own, ``p_s`` = this step's token share; sources without one fall back on the total's
  median), and the window holds residuals ``x_t = loss_t - predicted_t``. The expected loss is
  ``predicted + median(x_W)``.

A step is a **cliff** when, once armed (``step >= warmup`` and a full window of accepted steps):

1. it is far below the window in robust units, ``z = (median(x_W) - x) / (1.4826 * MAD(x_W) + eps) >
   threshold`` (``1.4826 * MAD`` estimates the standard deviation of Gaussian noise; median and MAD
   ignore the occasional spike that would inflate a std; for ``"total"`` this is ``(median - loss) /
   (1.4826 * MAD + eps)`` over past losses), and
2. the drop is large in relative terms, ``loss < (1 - min_relative_drop) * expected`` (so that a
   very quiet window does not turn a small dip into a cliff), and
3. with ``require_source``, the named source's own loss is anomalous too, ``z_s > threshold``
   (below). A shift of the mixture toward an easy source lowers the total with no source falling
   below its own baseline; that is the curriculum at work, not a cliff.

**Attribution rule.** Each source ``s`` present at this step (tokens > 0, finite loss) with at least
``min_source_history`` entries in the window gets its own robust score ``z_s = (median_s - loss_s) /
(1.4826 * MAD_s + eps_s)`` over its own history, weighted by its share of this step's tokens ``p_s =
tokens_s / sum(tokens)``. The named source maximises ``p_s * z_s``: the source whose anomalous drop
moves the total the most. None is named (index -1) when no product is positive.

Cliff steps never enter the window (a cliff must not become the new normal); neither do non-finite
losses. Per-source entries with zero tokens or a non-finite loss are stored as missing. After a
flag at step ``t`` the next flag can come at step ``t + cooldown`` at the earliest (steps
``t + 1`` to ``t + cooldown - 1`` raise none; cooldown 0 and 1 let every step flag); cliff steps
in that time are still kept out of the window. With ``respond``, a flagged source is added to ``CliffState.excluded_S``, for the trainer
to give it a ceiling of 0 (as the v3 polish did for ``repo-docs``).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, NamedTuple

import flax.struct
import jax
import jax.numpy as jnp
import ml_collections

from andrea_jax import checks

_MAD_TO_STD = 1.4826  # 1 / Phi^{-1}(3/4): MAD * this = std for Gaussian noise
_NEVER = -(2**30)  # last_flag_step before any flag: far enough that no cooldown applies
_BASELINES = ("mixture", "total")


def cliff_config() -> ml_collections.ConfigDict:
  """The ``cliff`` section of a training config, with its defaults (see the module docstring)."""
  c = ml_collections.ConfigDict()
  # Steps of accepted (non-cliff, finite) losses in the baseline window.
  c.window = 200
  # Robust z-score (median minus loss, in units of 1.4826 * MAD) above which a step is anomalous;
  # also the bar for the named source's own score.
  c.threshold = 6.0
  # The loss must also be below (1 - min_relative_drop) * expected loss; 0.15 = a 15% fall (a source
  # with 30% of the tokens falling from 2.5 to 0.13 drops the total by about 28%).
  c.min_relative_drop = 0.15
  # Steps before any flag (the loss falls fast and legitimately early on; v2's LR warmup is 2000).
  c.warmup = 2000
  # Mark the flagged source for exclusion (the trainer then gives it a ceiling of 0).
  c.respond = False
  # After a flag at step t, no new flag before step t + cooldown.
  c.cooldown = 200
  # Flag only when the named source's own loss is anomalous (not a mere shift of the mixture).
  c.require_source = True
  # Entries of a source's own history needed before it can be scored, named, or used for prediction.
  c.min_source_history = 10
  # "mixture": compare the loss with the one predicted at this step's mixture; "total": with the
  # median of past total losses.
  c.baseline = "mixture"
  return c


@dataclasses.dataclass(frozen=True)
class CliffConfig:
  """Validated detector settings; the fields and their meaning are those of :func:`cliff_config`.

  Example:
    >>> cfg = CliffConfig(window=100, warmup=500)
    >>> cfg = CliffConfig.from_config(config.cliff)  # from a ConfigDict section
  """
  window: int = 200
  threshold: float = 6.0
  min_relative_drop: float = 0.15
  warmup: int = 2000
  respond: bool = False
  cooldown: int = 200
  require_source: bool = True
  min_source_history: int = 10
  baseline: str = "mixture"

  def __post_init__(self):
    # Stored as checked: a numpy integer becomes an int (the config is static under jit).
    fields = {
        "window": checks.integer("cliff.window", self.window, minimum=3),
        "threshold": checks.number("cliff.threshold", self.threshold, low=0, low_open=True),
        "min_relative_drop": checks.number("cliff.min_relative_drop", self.min_relative_drop,
                                           low=0, high=1, high_open=True),
        "warmup": checks.integer("cliff.warmup", self.warmup, minimum=0),
        "respond": checks.flag("cliff.respond", self.respond),
        "cooldown": checks.integer("cliff.cooldown", self.cooldown, minimum=0),
        "require_source": checks.flag("cliff.require_source", self.require_source),
    }
    fields["min_source_history"] = checks.integer(
        "cliff.min_source_history", self.min_source_history, minimum=1, maximum=fields["window"],
        hint=f"at most cliff.window = {fields['window']}")
    fields["baseline"] = checks.choice("cliff.baseline", self.baseline, _BASELINES)
    for name, value in fields.items():
      object.__setattr__(self, name, value)

  @classmethod
  def from_config(cls, config: ml_collections.ConfigDict | dict[str, Any]) -> CliffConfig:
    """Builds and validates from a ``cliff`` config section; unknown fields are an error."""
    items = dict(config.to_dict() if isinstance(config, ml_collections.ConfigDict) else config)
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(items) - known)
    if unknown:
      raise ValueError(f"unknown cliff config field(s) {unknown}; known: {sorted(known)}")
    return cls(**items)


@flax.struct.dataclass
class CliffState:
  """The recent accepted steps (``W`` = window, ``S`` = sources), as ring buffers and sorted copies.

  The sorted copies (ascending per column, NaN padding at the end) give every median by indexing, so
  a step costs O(W * S) elementwise work and no sort.
  """
  loss_W: jax.Array  # total losses, in arrival order; NaN = empty slot
  x_W: jax.Array  # what the z-score is taken over: the loss ("total") or its residual ("mixture")
  loss_WxS: jax.Array  # per-source losses; NaN = missing
  tokens_WxS: jax.Array  # per-source token counts; 0 = missing
  sorted_loss_W: jax.Array  # loss_W sorted
  sorted_x_W: jax.Array  # x_W sorted
  sorted_loss_WxS: jax.Array  # each column of loss_WxS sorted
  pos: jax.Array  # [] int32, next slot to write
  count: jax.Array  # [] int32, accepted entries held (<= W)
  last_flag_step: jax.Array  # [] int32
  num_flags: jax.Array  # [] int32, flags raised so far
  excluded_S: jax.Array  # bool, sources marked for exclusion (only with respond)


@flax.struct.dataclass
class CliffEvent:
  """What one step's check found; scalars, logged by the trainer."""
  flag: jax.Array  # bool, a cliff was flagged at this step
  step: jax.Array  # int32
  score: jax.Array  # robust z of this step (0 while the window is empty or the loss non-finite)
  loss: jax.Array  # the total loss given
  expected: jax.Array  # the loss the baseline expects (the loss itself while the window is empty)
  source: jax.Array  # int32 index of the named source, -1 if none
  source_score: jax.Array  # that source's own robust z (0 if none)
  source_drop: jax.Array  # median_s - loss_s of that source, in loss units (0 if none)
  exclude: jax.Array  # bool, flag and respond and a source named


def cliff_init(num_sources: int, window: int) -> CliffState:
  """An empty detector state for ``num_sources`` sources and a ``window``-step baseline.

  Example:
    >>> state = cliff_init(16, cfg.window)
  """
  num_sources = checks.integer("cliff_init: num_sources", num_sources, minimum=1)
  window = checks.integer("cliff_init: window", window, minimum=3)
  # One buffer per field: the trainer donates the state, and XLA refuses to donate one buffer twice.
  def empty(*shape):
    return jnp.full(shape, jnp.nan, jnp.float32)
  return CliffState(
      loss_W=empty(window), x_W=empty(window), loss_WxS=empty(window, num_sources),
      tokens_WxS=jnp.zeros((window, num_sources), jnp.float32),
      sorted_loss_W=empty(window), sorted_x_W=empty(window),
      sorted_loss_WxS=empty(window, num_sources),
      pos=jnp.zeros((), jnp.int32),
      count=jnp.zeros((), jnp.int32),
      last_flag_step=jnp.full((), _NEVER, jnp.int32),
      num_flags=jnp.zeros((), jnp.int32),
      excluded_S=jnp.zeros((num_sources,), bool),
  )


def _sorted_replace(sorted_WxC: jax.Array, old_C: jax.Array, new_C: jax.Array,
                    evict_C: jax.Array, insert_C: jax.Array) -> jax.Array:
  """Removes ``old`` (where ``evict``), then inserts ``new`` (where ``insert``), column by column.

  Columns are ascending with NaN padding at the end; there is always a free slot for the insert
  because the ring buffer frees the evicted row's slot.
  """
  W, C = sorted_WxC.shape
  i_Wx1 = jnp.arange(W)[:, None]
  pad_1xC = jnp.full((1, C), jnp.nan, sorted_WxC.dtype)
  hit_WxC = sorted_WxC == old_C[None, :]
  first_1xC = jnp.argmax(hit_WxC, axis=0)[None, :]
  evict_1xC = (evict_C & jnp.any(hit_WxC, axis=0))[None, :]
  up_WxC = jnp.concatenate([sorted_WxC[1:], pad_1xC], axis=0)
  s_WxC = jnp.where(evict_1xC & (i_Wx1 >= first_1xC), up_WxC, sorted_WxC)
  # NaN compares False, so the rank counts valid entries only.
  rank_1xC = jnp.sum(s_WxC < new_C[None, :], axis=0)[None, :]
  down_WxC = jnp.concatenate([pad_1xC, s_WxC[:-1]], axis=0)
  insert_1xC = insert_C[None, :]
  s_WxC = jnp.where(insert_1xC & (i_Wx1 > rank_1xC), down_WxC, s_WxC)
  return jnp.where(insert_1xC & (i_Wx1 == rank_1xC), new_C[None, :], s_WxC)


def _sorted_median(sorted_WxC: jax.Array) -> jax.Array:
  """``[C]`` medians of NaN-padded ascending columns (NaN for an empty column)."""
  W = sorted_WxC.shape[0]
  n_C = jnp.sum(~jnp.isnan(sorted_WxC), axis=0)
  lo_1xC = jnp.clip((n_C - 1) // 2, 0, W - 1)[None, :]
  hi_1xC = jnp.clip(n_C // 2, 0, W - 1)[None, :]
  mid_C = 0.5 * (jnp.take_along_axis(sorted_WxC, lo_1xC, axis=0)[0]
                 + jnp.take_along_axis(sorted_WxC, hi_1xC, axis=0)[0])
  return jnp.where(n_C > 0, mid_C, jnp.nan)


def _median_1d(v_W: jax.Array) -> jax.Array:
  """Median of the non-NaN entries of a short vector by order statistics: O(W^2) compares, no sort.

  The k-th smallest value is the least ``v_j`` with ``#{i : v_i <= v_j} >= k``.
  """
  valid_W = ~jnp.isnan(v_W)
  n = jnp.sum(valid_W)
  v_W = jnp.where(valid_W, v_W, jnp.inf)
  at_most_W = jnp.sum(v_W[:, None] <= v_W[None, :], axis=0)

  def kth(k):
    return jnp.min(jnp.where(valid_W & (at_most_W >= k), v_W, jnp.inf))

  return jnp.where(n > 0, 0.5 * (kth((n + 1) // 2) + kth(n // 2 + 1)), jnp.nan)


def _scale(mad: jax.Array, ref: jax.Array) -> jax.Array:
  # The eps, relative to the size of the quantity, keeps a perfectly flat window finite.
  return _MAD_TO_STD * mad + 1e-6 * jnp.abs(ref) + 1e-12


def cliff_update(cfg: CliffConfig, state: CliffState, step: jax.Array | int, loss: jax.Array,
                 losses_S: jax.Array, tokens_S: jax.Array) -> tuple[CliffState, CliffEvent]:
  """Checks one training step for a cliff and folds it into the baseline unless it is one.

  See the module docstring for the rule. Jittable (bind ``cfg`` with ``functools.partial``); no host
  sync; O(W * S) elementwise work (plus a sort of the ``[W, S]`` window on the rare candidate step);
  NaN in the event only in ``loss``, and only where the given loss was NaN.

  Args:
    cfg: detector settings.
    state: from :func:`cliff_init` or the previous call.
    step: the training step (int).
    loss: ``[]`` this step's total training loss (token-weighted mean over sources).
    losses_S: ``[S]`` this step's mean loss per source (anything where a source had no tokens).
    tokens_S: ``[S]`` tokens per source in this step's batch.

  Returns:
    ``(new_state, event)``.

  Example:
    >>> update = jax.jit(functools.partial(cliff_update, cfg))
    >>> cliff, event = update(cliff, step, loss, losses_S, tokens_S)  # inside the train step
  """
  step = jnp.asarray(step, jnp.int32)
  loss = jnp.asarray(loss, jnp.float32)
  losses_S = jnp.asarray(losses_S, jnp.float32)
  tokens_S = jnp.asarray(tokens_S, jnp.float32)
  w = _against_window(cfg, state, step, loss, losses_S, tokens_S)
  # The per-source MADs are only needed (and, outside vmap, only computed) on a candidate.
  source, source_score, source_drop = jax.lax.cond(
      w.total_cliff, functools.partial(_attribute, state, losses_S, w),
      lambda _: (jnp.full((), -1, jnp.int32), jnp.zeros((), jnp.float32),
                 jnp.zeros((), jnp.float32)), None)
  named = source >= 0

  is_cliff = w.total_cliff
  if cfg.require_source:
    is_cliff = is_cliff & named & (source_score > cfg.threshold)
  in_cooldown = step - state.last_flag_step < cfg.cooldown
  flag = is_cliff & ~in_cooldown
  exclude = flag & named & cfg.respond
  new_state = _fold_in(cfg, state, w, w.finite & ~is_cliff, loss, losses_S)
  new_state = new_state.replace(
      last_flag_step=jnp.where(flag, step, state.last_flag_step),
      num_flags=state.num_flags + flag.astype(jnp.int32),
      excluded_S=state.excluded_S | (exclude & (jnp.arange(tokens_S.shape[0]) == source)))
  event = CliffEvent(flag=flag, step=step, score=w.z, loss=loss, expected=w.expected,
                     source=source, source_score=source_score, source_drop=source_drop,
                     exclude=exclude)
  return new_state, event


class _Window(NamedTuple):
  """One step against the detector's window (see :func:`cliff_update`)."""
  finite: jax.Array
  present_S: jax.Array
  median_S: jax.Array
  usable_S: jax.Array
  tokens_present_S: jax.Array
  share_S: jax.Array
  x: jax.Array
  z: jax.Array
  expected: jax.Array
  total_cliff: jax.Array


def _against_window(cfg: CliffConfig, state: CliffState, step: jax.Array, loss: jax.Array,
                    losses_S: jax.Array, tokens_S: jax.Array) -> _Window:
  """Each source's baseline, the step's residual ``x`` and its robust score ``z``."""
  finite = jnp.isfinite(loss)
  have_history = state.count > 0
  present_S = (tokens_S > 0) & jnp.isfinite(losses_S)
  median_S = _sorted_median(state.sorted_loss_WxS)
  held_S = jnp.sum(~jnp.isnan(state.sorted_loss_WxS), axis=0)
  usable_S = present_S & (held_S >= cfg.min_source_history)
  tokens_present_S = jnp.where(present_S, tokens_S, 0.0)
  share_S = tokens_present_S / jnp.maximum(jnp.sum(tokens_present_S), 1e-30)
  if cfg.baseline == "mixture":
    median_loss = jnp.where(have_history, _sorted_median(state.sorted_loss_W[:, None])[0], loss)
    covered = jnp.sum(jnp.where(usable_S, share_S, 0.0))
    predicted = (jnp.sum(jnp.where(usable_S, share_S * median_S, 0.0))
                 + (1.0 - covered) * median_loss)
  else:
    predicted = jnp.zeros((), jnp.float32)
  x = loss - predicted
  median_x = jnp.where(have_history, _sorted_median(state.sorted_x_W[:, None])[0], x)
  expected = jnp.where(finite, predicted + median_x, 0.0)
  mad_x = _median_1d(jnp.abs(state.x_W - median_x))
  z = jnp.where(finite & have_history, (median_x - x) / _scale(mad_x, expected), 0.0)
  armed = (step >= cfg.warmup) & (state.count >= cfg.window)
  total_cliff = armed & finite & (z > cfg.threshold) & (
      loss < (1 - cfg.min_relative_drop) * expected)
  return _Window(finite=finite, present_S=present_S, median_S=median_S, usable_S=usable_S,
                 tokens_present_S=tokens_present_S, share_S=share_S, x=x, z=z,
                 expected=expected, total_cliff=total_cliff)


def _attribute(state: CliffState, losses_S: jax.Array, w: _Window, _):
  """``(source, its score, its drop)``: the source whose own drop, weighted by its share of the
  batch, is largest (-1, 0, 0 when none dropped)."""
  mad_S = jnp.nanmedian(jnp.abs(state.loss_WxS - w.median_S[None, :]), axis=0)
  z_S = (w.median_S - losses_S) / _scale(mad_S, w.median_S)
  weighted_S = jnp.where(w.usable_S, w.share_S * z_S, -jnp.inf)
  best = jnp.argmax(weighted_S)
  named = weighted_S[best] > 0
  return (jnp.where(named, best, -1).astype(jnp.int32), jnp.where(named, z_S[best], 0.0),
          jnp.where(named, w.median_S[best] - losses_S[best], 0.0))


def _fold_in(cfg: CliffConfig, state: CliffState, w: _Window, accept: jax.Array,
             loss: jax.Array, losses_S: jax.Array) -> CliffState:
  """The window with this step written over its oldest entry when ``accept`` (not a cliff)."""
  row_S = jnp.where(w.present_S, losses_S, jnp.nan)

  def put(buf, value):
    return jnp.where(accept, buf.at[state.pos].set(value), buf)

  def resort(sorted_WxC, old_C, new_C, insert_C):
    return _sorted_replace(sorted_WxC, old_C, new_C, accept & ~jnp.isnan(old_C), accept & insert_C)

  one = jnp.ones((1,), bool)
  return state.replace(
      loss_W=put(state.loss_W, loss),
      x_W=put(state.x_W, w.x),
      loss_WxS=put(state.loss_WxS, row_S),
      tokens_WxS=put(state.tokens_WxS, w.tokens_present_S),
      sorted_loss_W=resort(state.sorted_loss_W[:, None], state.loss_W[state.pos][None],
                           loss[None], one)[:, 0],
      sorted_x_W=resort(state.sorted_x_W[:, None], state.x_W[state.pos][None], w.x[None],
                        one)[:, 0],
      sorted_loss_WxS=resort(state.sorted_loss_WxS, state.loss_WxS[state.pos], row_S,
                             w.present_S),
      pos=(state.pos + accept.astype(jnp.int32)) % cfg.window,
      count=jnp.minimum(state.count + accept.astype(jnp.int32), cfg.window))


def describe_event(event: CliffEvent, sources: tuple[str, ...] | list[str] | None = None) -> str:
  """A one-line, human-readable account of a (host-side) event, for logs.

  Example:
    >>> describe_event(event, SOURCES)
    'step 112080: cliff, loss 0.1300 is 41.2 robust sd below the expected 2.4100; source ...'
  """
  head = (f"step {int(event.step)}: {'cliff' if bool(event.flag) else 'no cliff'}, "
          f"loss {float(event.loss):.4f} is {float(event.score):.1f} robust sd below the expected "
          f"{float(event.expected):.4f}")
  s = int(event.source)
  if s < 0:
    return head + "; no source named"
  name = sources[s] if sources is not None and s < len(sources) else f"#{s}"
  tail = (f"; source {name} (own loss {float(event.source_drop):.4f} below its median, "
          f"{float(event.source_score):.1f} robust sd)")
  if bool(event.exclude):
    tail += "; marked for exclusion"
  return head + tail
