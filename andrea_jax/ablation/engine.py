"""Several variants of one model trained in one compiled program (vmap), and the loop to compare.

:func:`train_variants` stacks the ``K`` variants' states along a leading axis and runs one jitted
program: a ``lax.scan`` over a chunk of steps whose body is the AdamW step of
:mod:`andrea_jax.step` vmapped over the variants. The learning-rate schedule's ``peak_lr`` and
``warmup_steps`` are traced per variant (:func:`andrea_jax.optim.warmup_decay` accepts traced
values), so one compilation serves every warmup length and rate. All the variants see the same
batch at each step.

**The batches.** They come from the real sampler (:class:`andrea_jax.data.MixtureSampler`, seeded
with ``config.seed``) on the config's corpus, with a mixture fixed in advance rather than chosen by
the curriculum (a curriculum reacts to each variant's losses, so it would give each variant other
batches): by default the first phase of the config's curriculum, i.e. the uniform mixture
projected onto its first geometry (for the ANDREA geometries: the seven warmup sources at 1/7
each); or any ``[S]`` vector; or one ``[N, S]`` row per step, e.g. the weights of a simulated
curriculum (``andrea_jax.curriculum.simulate(...).weights``).

:func:`loop_baseline` trains the same variants one after the other with the normal jitted train
step (:func:`andrea_jax.step.jit_step`, curriculum and detector updates included) on the same
batches: the way one would run the ablation without this module, to measure what vmap saves.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from andrea_jax import checks
from andrea_jax import curriculum
from andrea_jax import data as data_lib
from andrea_jax import evaluate as eval_lib
from andrea_jax import optim
from andrea_jax import runconfig
from andrea_jax import step as step_lib
from andrea_jax import train
from andrea_jax.ablation import result as result_lib
from andrea_jax.ablation.variants import Variant, resolve_variants, run_config
from andrea_jax.model import init_params

PyTree = Any
Batch = dict[str, jax.Array]


@flax.struct.dataclass
class VariantState:
  """What one variant carries between steps (stacked ``[K, ...]`` across variants)."""
  step: jax.Array        # int32 scalar
  params: PyTree
  opt_state: PyTree
  skipped: jax.Array     # int32: non-finite steps skipped so far


def make_optimizer(spec: optim.OptimSpec, peak_lr: jax.Array, warmup_steps: jax.Array
                   ) -> tuple[optax.GradientTransformation, Any]:
  """The run's optimizer and schedule with a (possibly traced) ``peak_lr`` and ``warmup_steps``.

  Everything else (betas, weight decay, clipping, decay kind, run length) comes from ``spec``
  (the run's :class:`andrea_jax.optim.OptimSpec`, ``run.optim``).

  Example:
    >>> tx, lr = make_optimizer(run.optim, jnp.float32(3e-3), jnp.float32(20))
  """
  schedule = spec.learning_rate(peak_lr=peak_lr, warmup_steps=warmup_steps)
  return spec.transform(schedule), schedule


def variant_step(step_cfg: step_lib.StepConfig, spec: optim.OptimSpec, hyper: dict[str, jax.Array],
                 state: VariantState, batch: Batch) -> tuple[VariantState, dict[str, jax.Array]]:
  """One AdamW step of one variant: :func:`andrea_jax.step.train_step` without the curriculum.

  The same loss and gradient (:func:`andrea_jax.step.loss_and_grads`), the same clip + AdamW
  update (:func:`andrea_jax.step.apply_gradients`: one norm for the metric and the clipping, a
  non-finite step skipped, nothing changes). ``hyper`` holds the variant's scalar ``peak_lr`` and
  ``warmup_steps``; vmap this function over them and the state.
  """
  loss, grads, _, _ = step_lib.loss_and_grads(step_cfg, state.params, batch)
  tx, schedule = make_optimizer(spec, hyper["peak_lr"], hyper["warmup_steps"])
  params, opt_state, grad_norm, finite = step_lib.apply_gradients(
      dataclasses.replace(step_cfg, tx=tx), state.params, state.opt_state, grads, loss)
  new = VariantState(step=state.step + 1, params=params, opt_state=opt_state,
                     skipped=state.skipped + (~finite).astype(jnp.int32))
  # The rate applied: a skipped step does not advance the schedule's count (as in train_step).
  lr = schedule(step_lib.applied_count(state.opt_state, state.step))
  return new, {"loss": loss, "grad_norm": grad_norm, "lr": lr}


def _hyper(variants: list[Variant]) -> dict[str, jax.Array]:
  return {"peak_lr": jnp.asarray([v.peak_lr for v in variants], jnp.float32),
          "warmup_steps": jnp.asarray([v.warmup_steps for v in variants], jnp.float32)}


def _stack(trees: list[PyTree]) -> PyTree:
  return jax.tree.map(lambda *xs: jnp.stack(xs), *trees)


def _unstack(tree: PyTree, k: int) -> PyTree:
  return jax.tree.map(lambda x: x[k], tree)


def init_variants(run: runconfig.Run, variants: list[Variant]) -> VariantState:
  """Stacked initial states: variant ``k``'s parameters are those of a normal run with its seed."""
  params = _stack([
      jax.jit(init_params, static_argnums=0)(
          dataclasses.replace(run.model, init_std=v.init_std),
          train.run_keys(v.seed)["params"])   # the trainer's own key derivation
      for v in variants])
  hyper = _hyper(variants)
  opt_state = jax.vmap(lambda h, p: make_optimizer(
      run.optim, h["peak_lr"], h["warmup_steps"])[0].init(p))(hyper, params)
  k = len(variants)
  return VariantState(step=jnp.zeros((k,), jnp.int32), params=params, opt_state=opt_state,
                      skipped=jnp.zeros((k,), jnp.int32))


# --------------------------------------------------------------------------------------------------
# Data: the fixed mixture, the batches of a chunk of steps, the held-out windows.


def default_mixture(run: runconfig.Run) -> np.ndarray:
  """``[S]``: the first phase of the config's curriculum (uniform, or the mixture held in geometry
  0: the static mixer's or the geometry's own, brought into it)."""
  state = curriculum.init(run.curriculum, jax.random.PRNGKey(0))
  return np.asarray(curriculum.weights_at(curriculum.schedule(state), 0), np.float64)


def _mixture_table(run: runconfig.Run, mixture: Any, num_steps: int) -> np.ndarray:
  """``[N, S]`` weights of every step, validated."""
  num_sources = len(run.sources)
  w = default_mixture(run) if mixture is None else np.asarray(mixture, np.float64)
  if w.shape == (num_sources,):
    w = np.broadcast_to(w, (num_steps, num_sources))
  if w.shape != (num_steps, num_sources):
    raise ValueError(f"mixture must have shape [{num_sources}] or [num_steps = {num_steps}, "
                     f"{num_sources}], got {w.shape}")
  if not np.all(np.isfinite(w)) or np.any(w < 0):
    raise ValueError("mixture weights must be finite and >= 0")
  bad = np.flatnonzero(np.abs(w.sum(-1) - 1) > 1e-5)
  if bad.size:
    raise ValueError(f"mixture rows must sum to 1; row {bad[0]} sums to {w[bad[0]].sum():.6f}")
  return w


class _Data:
  """The corpus, the sampler and the held-out windows of an ablation."""

  def __init__(self, run: runconfig.Run, weights_NxS):
    used = tuple(s for s, u in zip(run.sources, (weights_NxS > 0).any(0)) if u)
    self.tokenizer = run.data.tokenizer
    self.data = data_lib.open_training_data(run.data, required=used, progress=False)
    self.sampler = data_lib.MixtureSampler(self.data, seq_len=run.data.seq_len,
                                           global_batch_size=run.data.global_batch_size,
                                           seed=run.seed)
    self.weights_NxS = weights_NxS
    self.eval_sources = used
    parts = []
    for name in used:
      b = data_lib.eval_batches(self.data, name, seq_len=run.data.seq_len,
                                num_sequences=run.eval.sequences_per_source)
      parts.append(dict(b, source_ids=np.full((b["inputs"].shape[0],), run.sources.index(name),
                                              np.int32)))
    self.eval_batch = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
    # The held-out rows in chunks of at most one training micro-batch, as the trainer's evaluation
    # cuts them: K variants then evaluate a chunk with less memory than their vmapped training
    # step already holds (K x micro-batch rows, with the backward pass), never K x all the rows.
    rows = len(self.eval_batch["inputs"])
    micro = run.data.micro_batch_size
    num_chunks = -(-rows // micro)
    self.eval_chunks = eval_lib.eval_chunks(self.eval_batch, -(-rows // num_chunks))

  def chunk(self, bounds: tuple[int, int]) -> Batch:
    """The batches of steps ``[lo, hi)`` stacked: ``[hi - lo, B, T]`` (``source_ids [C, B]``)."""
    lo, hi = bounds
    batches = [self.sampler.batch(t, self.weights_NxS[t]) for t in range(lo, hi)]
    return {k: np.stack([b[k] for b in batches]) for k in batches[0]}


def _chunks(num_steps: int, eval_every: int, chunk_steps: int) -> list[tuple[int, int]]:
  """Step ranges ``[lo, hi)``; every evaluation step (and ``num_steps``) ends a chunk."""
  ends = set(range(chunk_steps, num_steps, chunk_steps)) | {num_steps}
  if eval_every:
    ends |= set(range(eval_every, num_steps, eval_every))
  ends = sorted(ends)
  return list(zip([0] + ends[:-1], ends))


def _check_counts(num_steps: int, eval_every: int, chunk_steps: int) -> None:
  for name, v, lo in (("num_steps", num_steps, 1), ("eval_every", eval_every, 0),
                      ("chunk_steps", chunk_steps, 1)):
    checks.integer(name, v, minimum=lo)


def _eval_fn(run: runconfig.Run):
  """``(params_K, chunks) -> (loss_KxS, tokens_KxS)``: every variant's per-source sums over the
  held-out chunks, one vmapped call per chunk (one compilation: the chunks have equal rows)."""
  model, num_sources = run.step.model, len(run.sources)
  per_variant = lambda p, b: step_lib.eval_losses(model, p, b, num_sources)
  one_chunk = jax.jit(jax.vmap(per_variant, in_axes=(0, None)))

  def evaluate(params_K: PyTree, chunks: list[Batch]) -> tuple[jax.Array, jax.Array]:
    loss_KxS, tokens_KxS = one_chunk(params_K, chunks[0])
    for chunk in chunks[1:]:
      loss, tokens = one_chunk(params_K, chunk)
      loss_KxS, tokens_KxS = loss_KxS + loss, tokens_KxS + tokens
    return loss_KxS, tokens_KxS
  return evaluate


def _setup(config, variants, num_steps, eval_every, chunk_steps, mixture):
  _check_counts(num_steps, eval_every, chunk_steps)
  num_steps, eval_every, chunk_steps = int(num_steps), int(eval_every), int(chunk_steps)
  resolved = resolve_variants(config, variants, num_steps)
  # The shared config holds the shortest warmup of the variants (each brings its own, checked
  # above): the config file's own warmup, which no variant may use, is not validated here.
  base = run_config(config, num_steps)
  base.optim.warmup_steps = min(v.warmup_steps for v in resolved)
  run = runconfig.build(base)
  weights_NxS = _mixture_table(run, mixture, num_steps)
  return resolved, base, run, _Data(run, weights_NxS)


# --------------------------------------------------------------------------------------------------
# The two ways to train.


def train_variants(config: ml_collections.ConfigDict, variants: list[dict[str, Any]],
                   num_steps: int | None = None, *, eval_every: int = 0, chunk_steps: int = 50,
                   mixture: Any = None, samples: bool = True) -> result_lib.AblationResult:
  """Trains ``K`` variants of ``config``'s model in one compiled program; returns every curve.

  The program is ``jit(scan over a chunk of steps of vmap over variants of variant_step)``, the
  state donated; chunks end at the evaluations (every ``eval_every`` steps and at the end), where
  the held-out loss of every variant and source is computed (one vmapped call per chunk of
  held-out rows, at most a training micro-batch each). Chunks of another length (a remainder)
  compile once more.

  Args:
    config: a run config (``experiments/tiny.py``); its model, data, optimizer and ``seed`` (the
      batches' seed) are shared by every variant.
    variants: ``K`` dicts of :data:`~andrea_jax.ablation.variants.VARIANT_FIELDS`.
    num_steps: training steps (default ``config.train.num_steps``); also the schedule's length.
    eval_every: steps between held-out evaluations; 0 = only at the end.
    chunk_steps: steps per compiled scan (host round trips happen only between chunks).
    mixture: ``None`` (the curriculum's first phase), ``[S]`` or ``[num_steps, S]`` weights.
    samples: generate text from ``config.eval.prompts`` at the end and score its repetition.

  Returns:
    An :class:`~andrea_jax.ablation.result.AblationResult` (``loss [K, N]``, ``eval_loss [K, E,
    S]``, final stacked ``params``, samples and repetition scores, timings).

  Example:
    >>> res = train_variants(tiny_config, [{"warmup_steps": 0, "seed": s} for s in range(4)]
    ...                      + [{"warmup_steps": 50, "seed": s} for s in range(4)], 500,
    ...                      eval_every=100)
    >>> res.loss.shape, res.final_loss().round(2)
    ((8, 500), array([...]))
  """
  num_steps = config.train.num_steps if num_steps is None else num_steps
  resolved, base, run, data = _setup(config, variants, num_steps, eval_every, chunk_steps, mixture)
  step_cfg = run.step
  hyper = _hyper(resolved)

  def chunk_fn(states, hyper, batches):
    one = lambda h, s, b: variant_step(step_cfg, run.optim, h, s, b)
    body = lambda states, batch: jax.vmap(one, in_axes=(0, 0, None))(hyper, states, batch)
    return jax.lax.scan(body, states, batches)   # metrics [C, K]

  program = jax.jit(chunk_fn, donate_argnums=0)
  evaluate = _eval_fn(run)
  states = init_variants(run, resolved)
  chunks = _chunks(num_steps, eval_every, chunk_steps)
  compiled: dict[int, Any] = {}
  timer = result_lib.Timer()
  metrics, evals = [], []
  with data_lib.Prefetcher(lambda i: data.chunk(chunks[i]), start_step=0, depth=2,
                           end_step=len(chunks)) as batches:
    for (lo, hi), chunk in zip(chunks, batches):
      n = hi - lo
      if n not in compiled:   # ahead-of-time, so that compilation is timed on its own
        with timer.compiling():
          compiled[n] = program.lower(states, hyper, chunk).compile()
      with timer.running():
        states, m = compiled[n](states, hyper, chunk)
        metrics.append(m)
        if hi == num_steps or (eval_every and hi % eval_every == 0):
          evals.append((hi, evaluate(states.params, data.eval_chunks)))
        jax.block_until_ready(states.params)
  return result_lib.collect(run, data, resolved, metrics, evals, states.params,
                            states.skipped, timer, samples=samples, config=base,
                            num_steps=num_steps, method="vmap")


def loop_baseline(config: ml_collections.ConfigDict, variants: list[dict[str, Any]],
                  num_steps: int | None = None, *, eval_every: int = 0, chunk_steps: int = 50,
                  mixture: Any = None, samples: bool = True) -> result_lib.AblationResult:
  """The same ablation, one variant after the other, each with the normal jitted train step.

  Each variant gets its own config (its seed, warmup, rate, init scale), its own
  :func:`andrea_jax.runconfig.build`, :func:`andrea_jax.train.init_state` and
  :func:`andrea_jax.step.jit_step` (so its own compilation, as a user running the variants as
  separate jobs would get), and the same batches as :func:`train_variants`. Arguments and result
  as in :func:`train_variants`.

  Example:
    >>> fast = train_variants(c, vs, 200); slow = loop_baseline(c, vs, 200)
    >>> slow.seconds / fast.seconds   # the speed-up of the vmapped program
  """
  num_steps = config.train.num_steps if num_steps is None else num_steps
  resolved, base, run, data = _setup(config, variants, num_steps, eval_every, chunk_steps, mixture)
  evaluate = _eval_fn(run)
  chunks = _chunks(num_steps, eval_every, chunk_steps)
  timer = result_lib.Timer()
  finals, skipped, per_variant_metrics, per_variant_evals = [], [], [], []
  for v in resolved:
    vrun = runconfig.build(run_config(base, num_steps, v))
    state = jax.jit(lambda: train.init_state(vrun, train.run_keys(v.seed)))()
    step_fn = step_lib.jit_step(vrun.step)
    metrics, evals = [], []
    with data_lib.Prefetcher(lambda i: data.chunk(chunks[i]), start_step=0, depth=2,
                             end_step=len(chunks)) as batches:
      for (lo, hi), chunk in zip(chunks, batches):
        if lo == 0:
          with timer.compiling():
            step_fn = step_fn.lower(state, _row(chunk, 0)).compile()
        with timer.running():
          for i in range(hi - lo):
            state, m = step_fn(state, _row(chunk, i))
            metrics.append({k: m[k] for k in ("loss", "grad_norm", "lr", "finite")})
          if hi == num_steps or (eval_every and hi % eval_every == 0):
            evals.append((hi, jax.tree.map(lambda x: x[0],
                                           evaluate(_stack([state.params]), data.eval_chunks))))
          jax.block_until_ready(state.params)
    finals.append(state.params)
    skipped.append(sum(int(not bool(m["finite"])) for m in metrics))
    per_variant_metrics.append({k: jnp.stack([m[k] for m in metrics])
                                for k in ("loss", "grad_norm", "lr")})
    per_variant_evals.append(evals)
  # Into the layout of train_variants: one chunk of metrics [N, K], evaluations over [K, ...].
  metrics = [{k: jnp.stack([m[k] for m in per_variant_metrics], axis=1)
              for k in ("loss", "grad_norm", "lr")}]
  evals = [(step, jax.tree.map(lambda *xs: jnp.stack(xs), *[e[j][1] for e in per_variant_evals]))
           for j, (step, _) in enumerate(per_variant_evals[0])]
  return result_lib.collect(run, data, resolved, metrics, evals, _stack(finals),
                            jnp.asarray(skipped), timer, samples=samples, config=base,
                            num_steps=num_steps, method="loop")


def _row(chunk: Batch, i: int) -> Batch:
  return {k: v[i] for k, v in chunk.items()}
