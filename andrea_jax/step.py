"""The training state and the one jitted step ``(state, batch) -> (state, metrics)``.

Everything that changes during a run lives in :class:`TrainState` (a pytree that goes whole into each
checkpoint); everything that does not (the model, the optimizer, the curriculum tables) is bound into the
step when it is built. The step does, in order:

1. forward and backward over the batch, split into ``grad_accum_steps`` micro-batches scanned on device
   (one call = one optimizer step, so the schedule, the curriculum and the checkpoints all count the same
   steps); the output projection and the cross-entropy run fused (:mod:`andrea_jax.xent`: bf16
   matmuls with float32 accumulation, no float32 logits), and the loss is divided by the batch's
   token count inside, so the gradient comes out as the mean's;
2. the per-source mean loss and token counts, a segment sum over the batch's source ids;
3. the gradient's global norm, computed once for the metric and the clipping, then the AdamW
   update -- skipped, leaving the state untouched, when the loss, the gradient or the new weights are
   not finite;
4. the curriculum update with the per-source losses and the probes' signals (the weights of the
   batches to come);
5. the zombie-cliff detector on the same numbers (it may exclude a source from the next phase on).

Before all of this, each of the run's probes (:mod:`andrea_jax.probes`; the target gain of
:mod:`andrea_jax.probes.target_gain` among them) measures its per-source signal at the weights the
step starts from, at its own cadence (``lax.cond``: NaN and nothing computed at the other steps),
on the rows the batch carries for it.

Batches are dicts of arrays: ``inputs``, ``targets``, ``segment_ids``, ``positions`` ``[B, T]`` int32
and ``source_ids`` ``[B]`` int32 (see :mod:`andrea_jax.data`), and ``loss_mask`` ``[B, T]`` uint8
when some source of the run counts only some of its tokens (a chat source's ``loss_on``); a run
with probes adds each probe's rows under ``probes/<name>/<group>/`` (:func:`probes.rows_key`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import flax
import jax
import jax.numpy as jnp
import optax

from andrea_jax import cliff as cliff_lib
from andrea_jax import curriculum
from andrea_jax import probes as probes_lib
from andrea_jax import xent as xent_lib
from andrea_jax.model import Transformer

PyTree = Any
Batch = dict[str, jax.Array]


@flax.struct.dataclass
class TrainState:
  """Everything a run carries from one step to the next (and into checkpoints)."""
  step: jax.Array                 # int32 scalar: the next step to run
  params: PyTree                  # float32 model parameters
  opt_state: PyTree               # optax state (AdamW moments, counts)
  curriculum: curriculum.CurriculumState
  cliff: cliff_lib.CliffState     # the zombie-cliff detector
  nonfinite_streak: jax.Array     # int32: consecutive skipped (non-finite) steps so far
  halted_at: jax.Array            # int32: first step of a streak that reached the limit; -1 if none
  rows_seen: jax.Array            # [S] int32: rows of each source trained on (skipped steps not)


@dataclasses.dataclass(frozen=True)
class StepConfig:
  """What the step needs that never changes during a run.

  ``xent`` and ``lean_update`` are speed paths with the same results (to float32 rounding in
  float32; bf16 logits in bf16: see :mod:`andrea_jax.xent`); ``None`` and ``False`` give the
  earlier forms, kept for the A/B rows of bench/gpu.py.
  """
  model: Transformer
  tx: optax.GradientTransformation
  schedule: Callable[[jax.Array], jax.Array]
  curriculum: curriculum.CurriculumSpec
  cliff: cliff_lib.CliffConfig
  num_sources: int
  grad_accum_steps: int = 1
  max_nonfinite_steps: int = 5
  document_mask: bool = True      # attention within each packed document only (see token_losses)
  probes: tuple[probes_lib.Probe, ...] = ()   # in-step measurements, each at its own cadence
  # The fused output projection and loss (None: the model's float32 logits, then optax's loss).
  xent: xent_lib.XentConfig | None = xent_lib.XentConfig()
  # The loss divided by the token count inside (the gradient comes out divided), and one global
  # norm for the metric and the clipping (False: the gradient divided after, clipping's own norm).
  lean_update: bool = True


def token_losses(model: Transformer, params: PyTree, batch: Batch, document_mask: bool = True, *,
                 xent: xent_lib.XentConfig | None = None) -> tuple[jax.Array, jax.Array]:
  """Per-token cross-entropy ``[B, T]`` (float32) and the mask of tokens that count ``[B, T]``.

  ``loss[b, t] = weights[b, t] * CE(logits[b, t], targets[b, t])`` with the weights of
  :func:`loss_weights`. With ``document_mask`` a token attends only to earlier tokens of its own
  document (the segment ids); without, to every earlier token of its row (plain causal attention,
  as GPT-2 trained: the fused cuDNN kernel's fastest path).

  ``xent``: run the output projection and the loss fused (:func:`andrea_jax.xent.cross_entropy`,
  what the train step does) instead of taking the model's float32 logits (what evaluation does):
  the same values in float32, bf16 logits in bf16.
  """
  mask_BxT = loss_weights(batch)
  if xent is not None:
    cfg = model.config
    segment_ids = batch["segment_ids"] if document_mask else None
    x_BxTxD = model.apply({"params": params}, batch["inputs"], segment_ids=segment_ids,
                          positions=batch["positions"], hidden=True)
    loss_BxT = xent_lib.cross_entropy(
        x_BxTxD, params["wte"]["embedding"], batch["targets"], mask_BxT,
        vocab_size=cfg.vocab_size, dtype=cfg.compute_dtype, logits_dtype=xent.logits_dtype,
        block_rows=xent.block_rows)
    return loss_BxT, mask_BxT
  loss_BxT = _cross_entropy(model, params, batch, document_mask)
  return loss_BxT * mask_BxT, mask_BxT


def loss_weights(batch: Batch) -> jax.Array:
  """``[B, T]`` float32: 1 for each target the loss counts, 0 for the others; the one place they
  are decided: ``(segment_ids > 0) * loss_mask``. Padding (segment id 0) never counts, nor, when
  the batch has a ``loss_mask``, a target its source's ``loss_on`` leaves out (a user's turn).

  Example:
    >>> loss_weights({"segment_ids": jnp.array([[1, 1, 0]]),
    ...               "loss_mask": jnp.array([[0, 1, 1]], jnp.uint8)}).tolist()
    [[0.0, 1.0, 0.0]]
  """
  mask_BxT = (batch["segment_ids"] > 0).astype(jnp.float32)
  if "loss_mask" in batch:   # a key of the run's batches, fixed when the step is traced
    mask_BxT = mask_BxT * batch["loss_mask"].astype(jnp.float32)
  return mask_BxT


def _cross_entropy(model: Transformer, params: PyTree, batch: Batch,
                   document_mask: bool) -> jax.Array:
  """``[B, T]`` float32 cross-entropy of every target, whether it counts or not."""
  segment_ids = batch["segment_ids"] if document_mask else None
  logits_BxTxV = model.apply({"params": params}, batch["inputs"],
                             segment_ids=segment_ids, positions=batch["positions"])
  return optax.softmax_cross_entropy_with_integer_labels(
      logits_BxTxV.astype(jnp.float32), batch["targets"])


def per_source_sums(loss_BxT: jax.Array, mask_BxT: jax.Array, source_ids_B: jax.Array,
                    num_sources: int) -> tuple[jax.Array, jax.Array]:
  """Summed loss and token count per source, ``([S], [S])``, by a segment sum over rows."""
  loss_S = jax.ops.segment_sum(loss_BxT.sum(-1), source_ids_B, num_segments=num_sources)
  tokens_S = jax.ops.segment_sum(mask_BxT.sum(-1), source_ids_B, num_segments=num_sources)
  return loss_S, tokens_S


def _split_micro(batch: Batch, k: int) -> Batch:
  # Micro-batch j takes rows j, j + k, j + 2k, ...: each device's rows of the sharded batch split
  # evenly among the micro-batches, so every micro-batch runs on every device (consecutive rows
  # would put micro-batch 0 on the first devices only).
  return jax.tree.map(lambda x: x.reshape(x.shape[0] // k, k, *x.shape[1:]).swapaxes(0, 1), batch)


def loss_and_grads(cfg: StepConfig, params: PyTree, batch: Batch):
  """Mean token loss, its gradient, and per-source ``(loss sums [S], tokens [S])``.

  With ``grad_accum_steps = k`` the batch is cut into k micro-batches (rows ``j, j + k, ...``)
  whose gradients are summed in a ``lax.scan`` (memory of one micro-batch): the result equals the
  full-batch gradient. Under ``cfg.lean_update`` each micro-batch's loss sum is divided by the
  whole batch's token count ``n`` (known from the segment ids before the forward pass) inside the
  differentiated function, so the cotangent ``1 / n`` rides the backward pass and the gradient
  comes out divided; otherwise the summed gradient is divided by ``n`` afterwards (a pass over it).
  """
  n = jnp.maximum(loss_weights(batch).sum(), 1.0)
  scale = 1.0 / n if cfg.lean_update else 1.0

  def micro(params, mb):
    def total_loss(p):
      loss_BxT, mask_BxT = token_losses(cfg.model, p, mb, cfg.document_mask, xent=cfg.xent)
      return loss_BxT.sum() * scale, (loss_BxT, mask_BxT)
    (loss, (loss_BxT, mask_BxT)), g = jax.value_and_grad(total_loss, has_aux=True)(params)
    ls, ts = per_source_sums(loss_BxT, mask_BxT, mb["source_ids"], cfg.num_sources)
    return loss, g, ls, ts

  if cfg.grad_accum_steps == 1:
    loss, grads, loss_S, tokens_S = micro(params, batch)
  else:
    def body(carry, mb):
      out = micro(params, mb)
      return jax.tree.map(jnp.add, carry, out), None
    zeros = (jnp.zeros((), jnp.float32), jax.tree.map(jnp.zeros_like, params),
             jnp.zeros((cfg.num_sources,), jnp.float32), jnp.zeros((cfg.num_sources,), jnp.float32))
    (loss, grads, loss_S, tokens_S), _ = jax.lax.scan(
        body, zeros, _split_micro(batch, cfg.grad_accum_steps))
  if cfg.lean_update:
    return loss, grads, loss_S, tokens_S
  return loss / n, jax.tree.map(lambda g: g / n, grads), loss_S, tokens_S


def all_finite(tree: PyTree) -> jax.Array:
  """Whether every element of every leaf of ``tree`` is finite (a boolean scalar)."""
  leaves = [jnp.isfinite(x).all() for x in jax.tree.leaves(tree)]
  return jnp.stack(leaves).all() if leaves else jnp.bool_(True)


def applied_count(opt_state: PyTree, step: jax.Array) -> jax.Array:
  """The count the optimizer's learning-rate schedule reads at this update: optax's
  ``ScaleByScheduleState.count``, which a skipped (non-finite) step does not advance, so the
  logged rate is the rate applied; ``step`` when the optimizer holds no schedule state."""
  found = [s.count for s in jax.tree.leaves(
      opt_state, is_leaf=lambda x: isinstance(x, optax.ScaleByScheduleState))
           if isinstance(s, optax.ScaleByScheduleState)]
  return found[0] if found else step


def apply_gradients(cfg: StepConfig, params: PyTree, opt_state: PyTree, grads: PyTree,
                    loss: jax.Array) -> tuple[PyTree, PyTree, jax.Array, jax.Array]:
  """The update of one step: ``(params, opt_state, grad_norm, finite)``.

  ``grad_norm = ||grads||`` over every leaf; ``cfg.tx`` (clipping, AdamW) applied to the mean
  gradient ``grads``; ``finite`` = the loss, the norm and the new weights are all finite. When it is
  False the step is skipped: ``params`` and ``opt_state`` come back as they were (so a NaN never
  reaches the weights or the moments, and a schedule in ``opt_state`` does not advance).
  """
  grad_norm = optax.tree_utils.tree_norm(grads)
  finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
  if cfg.lean_update:
    # The norm just computed is the clipping's too (andrea_jax.optim.clip_by_global_norm reads it;
    # a transformation without the argument ignores it).
    updates, new_opt_state = optax.with_extra_args_support(cfg.tx).update(
        grads, opt_state, params, grad_norm=grad_norm)
  else:
    updates, new_opt_state = cfg.tx.update(grads, opt_state, params)
  new_params = optax.apply_updates(params, updates)
  # A finite gradient can still give a non-finite update (a rate or a weight decay that overflows
  # a finite weight, or any other optimizer's arithmetic), and whether it did cannot be known
  # before the new weights are: no bound on the old state decides it exactly. So the new weights
  # are read once more, and the select below follows that read (with the state donated, deciding
  # before the update would let it be written in place, but would skip some finite steps or keep
  # some non-finite ones).
  finite = finite & all_finite(new_params)
  keep = lambda new, old: jax.tree.map(lambda a, b: jnp.where(finite, a, b), new, old)
  return keep(new_params, params), keep(new_opt_state, opt_state), grad_norm, finite


def probe_context(cfg: StepConfig) -> probes_lib.ProbeContext:
  """What the step lends its probes: the training model's per-token loss (float32 logits), and
  the same through XLA attention for forward-mode differentiation (cuDNN's kernel has a custom
  gradient, which ``jax.jvp`` cannot go through): the same weights and function."""
  plain = Transformer(dataclasses.replace(cfg.model.config, attention_impl="xla"))
  return probes_lib.ProbeContext(
      num_sources=cfg.num_sources,
      token_losses=lambda p, rows: token_losses(cfg.model, p, rows, cfg.document_mask),
      forward_token_losses=lambda p, rows: token_losses(plain, p, rows, cfg.document_mask))


def measure_probes(cfg: StepConfig, state: TrainState, rows: dict) -> dict[str, jax.Array]:
  """Each probe's ``[S]`` signal at ``state``'s weights on its rows: measured at its steps
  (:func:`andrea_jax.probes.is_due`), NaN at the others (``lax.cond``: nothing computed)."""
  ctx, signals = probe_context(cfg), {}
  for probe in cfg.probes:
    def measure(params, opt_state, groups, probe=probe):
      return jnp.asarray(probe.measure(ctx, probes_lib.At(state.step, params, opt_state), groups),
                         jnp.float32)
    signals[probe.name] = jax.lax.cond(
        probes_lib.is_due(state.step, probe.every), measure,
        lambda *_: jnp.full((cfg.num_sources,), jnp.nan, jnp.float32),
        state.params, state.opt_state, rows[probe.name])
  return signals


def train_step(cfg: StepConfig, state: TrainState, batch: Batch) -> tuple[TrainState, dict]:
  """One optimizer step; pure. Jit it once with ``donate_argnums`` on the state (see :func:`jit_step`)."""
  step = state.step
  batch, rows = probes_lib.split(batch)
  signals = measure_probes(cfg, state, rows)
  loss, grads, loss_sum_S, tokens_S = loss_and_grads(cfg, state.params, batch)
  params, opt_state, grad_norm, finite = apply_gradients(cfg, state.params, state.opt_state,
                                                         grads, loss)

  losses_S = loss_sum_S / jnp.maximum(tokens_S, 1.0)
  cur = curriculum.update(cfg.curriculum, state.curriculum, step, losses_S,
                          jnp.where(finite, tokens_S, 0.0), signals)
  cliff_state, event = cliff_lib.cliff_update(cfg.cliff, state.cliff, step, loss, losses_S,
                                              jnp.where(finite, tokens_S, 0.0))
  if cfg.cliff.respond:
    # The flagged source gets a ceiling of 0 from the next undecided phase on (as the polish did).
    cur = jax.lax.cond(event.exclude,
                       lambda c: curriculum.exclude(cfg.curriculum, c, cliff_state.excluded_S),
                       lambda c: c, cur)

  streak = jnp.where(finite, 0, state.nonfinite_streak + 1)
  halted_at = jnp.where((state.halted_at < 0) & (streak >= cfg.max_nonfinite_steps),
                        step - streak + 1, state.halted_at)
  rows_S = jax.ops.segment_sum(jnp.ones_like(batch["source_ids"]), batch["source_ids"],
                               num_segments=cfg.num_sources)
  rows_seen = state.rows_seen + jnp.where(finite, rows_S, 0).astype(jnp.int32)
  new_state = TrainState(step=step + 1, params=params, opt_state=opt_state, curriculum=cur,
                         cliff=cliff_state, nonfinite_streak=streak, halted_at=halted_at,
                         rows_seen=rows_seen)
  metrics = {
      "step": step,
      "loss": loss,
      "grad_norm": grad_norm,
      "lr": cfg.schedule(applied_count(state.opt_state, step)),
      "finite": finite,
      "source_loss": losses_S,
      "source_tokens": tokens_S,
      "schedule": curriculum.schedule(cur),
      "curriculum": curriculum.metrics(cfg.curriculum, cur),
      "cliff": event,
      "halted_at": halted_at,
      "rows_seen": rows_seen,
      "signals": signals,
  }
  return new_state, metrics


def jit_step(cfg: StepConfig, state_sharding: PyTree | None = None,
             batch_sharding: jax.sharding.NamedSharding | None = None) -> Callable:
  """``train_step`` jitted once, the state donated (its buffers are reused for the new state).

  With shardings (see :mod:`andrea_jax.sharding`) the state keeps ``state_sharding`` from step to
  step, the batch arrives as ``batch_sharding`` and the metrics come back replicated, so every
  process can read them.

  Example:
    >>> step_fn = jit_step(run.step, state_shardings, batch_sharding(mesh))
    >>> state, metrics = step_fn(state, batch)
  """
  kw = {}
  if state_sharding is not None:
    metrics = jax.sharding.NamedSharding(batch_sharding.mesh, jax.sharding.PartitionSpec())
    kw = dict(in_shardings=(state_sharding, batch_sharding),
              out_shardings=(state_sharding, metrics))
  return jax.jit(lambda s, b: train_step(cfg, s, b), donate_argnums=0, **kw)


def eval_losses(model: Transformer, params: PyTree, batch: Batch, num_sources: int,
                document_mask: bool = True):
  """Per-source summed loss and token count on a (held-out) batch: ``([S], [S])``, over the
  tokens that count (:func:`token_losses`)."""
  loss_BxT, mask_BxT = token_losses(model, params, batch, document_mask)
  return per_source_sums(loss_BxT, mask_BxT, batch["source_ids"], num_sources)


def eval_losses_all_tokens(model: Transformer, params: PyTree, batch: Batch, num_sources: int,
                           document_mask: bool = True):
  """:func:`eval_losses`, then the same sums over every token (its ``loss_mask`` ignored), from
  one forward pass: ``([S], [S], [S], [S])``.

  Example:
    >>> loss_S, tokens_S, all_loss_S, all_tokens_S = eval_losses_all_tokens(model, params, b, 16)
    >>> held_out_loss_S = loss_S / jnp.maximum(tokens_S, 1.0)   # the assistant's turns only
  """
  loss_BxT = _cross_entropy(model, params, batch, document_mask)
  counted_BxT = loss_weights(batch)
  every_BxT = loss_weights({k: v for k, v in batch.items() if k != "loss_mask"})
  return (*per_source_sums(loss_BxT * counted_BxT, counted_BxT, batch["source_ids"], num_sources),
          *per_source_sums(loss_BxT * every_BxT, every_BxT, batch["source_ids"], num_sources))
