r"""Data elasticities read off one pilot run's curvature: the truncated-horizon influence.

The designed proxy (:mod:`.proxy`, ``python -m study.mixing.fit_proxy``) pays for each source's
data elasticity ``b_s = -dL_s / d ln w_s`` with 20 probe runs. This module reads the same
quantity off one uniform run instead. A change of share moves the *balance* between the sources'
tugs, and the balance point's response is the influence function; a run of finite length is at
that balance only in the directions it has had time to settle (under Adam's preconditioned flow a
direction of curvature ``h`` settles once ``h sum_t lr_t >~ 1``), so the estimate is

.. math::  \hat b_s = w_s\, (g_s^A)^T (G + \lambda P^{-1})^{-1} g_s^B,
   \qquad \lambda = 1 / \sum_{t' < t} lr_{t'}

with ``w_s`` the source's token share of the batch, ``g_s^A`` and ``g_s^B`` the mean gradients of
two disjoint halves of its rows (independent draws: their product has no self-noise term), ``G``
the Gauss-Newton matrix of the batch's token-mean cross-entropy and ``P`` Adam's bias-corrected
diagonal preconditioner ``1 / (sqrt(v_hat) + eps)`` (AdamW's decoupled weight decay left out).
It has no free parameter: the first-order sum in the directions that have not settled, the
balance point's response in those that have. The system is positive definite and is solved by
conjugate gradients preconditioned with ``P`` (one solve per source, all sources at once under
``jax.vmap``).

Measured on the built-in corpus (``study/mixing/LOG.md``, "Can the gradients replace the probes?"
and "One pilot run instead of 20 probes"): four measurements late in the first half of a uniform
0.13M run give the 20 probes' elasticities back (Pearson r 0.93 of the power-1.5 mixtures, in the
probes' units); as the recipe's fit they reach uniform's final loss 19.5% sooner (nine seeds; the
probes' 23.4%). Measured early in the target run itself they lose to uniform: early curvature
ranks the sources learned fastest first.

Functions: :func:`adam_preconditioner`, :func:`make_row_grads`, :func:`halves`,
:func:`make_gauss_newton`, :func:`influence_solve`, :func:`make_influence` (the measurement, its
solves compiled once), :func:`influence` (one measurement), :func:`measurement_tokens` (its cost)
and :func:`pilot` (a uniform run measured at given steps).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import numpy as np

CG_TOL = 1e-3


def adam_preconditioner(opt_state, eps: float, b2: float):
  """``1 / (sqrt(v_hat) + eps)`` per parameter, from the AdamW state inside ``opt_state``
  (bias-corrected with its count: the state before the step measured, so the step's own gradient
  is not in it); ``None`` before the first update. A ``ValueError`` if the state holds no Adam."""
  import jax
  import jax.numpy as jnp
  import optax
  found = [s for s in jax.tree.leaves(
      opt_state, is_leaf=lambda x: isinstance(x, optax.ScaleByAdamState))
           if isinstance(s, optax.ScaleByAdamState)]
  if not found:
    raise ValueError("no optax.ScaleByAdamState in the optimizer state")
  count = int(found[0].count)
  if count == 0:
    return None
  corr = 1.0 - b2 ** count
  return jax.tree.map(lambda v: 1.0 / (jnp.sqrt(v / corr) + eps), found[0].nu)


def make_row_grads(model, document_mask: bool):
  """``f(params, batch) -> (grads [B, ...] pytree, tokens [B])``: each row's mean-token-loss
  gradient (``jax.vmap`` over rows), jitted."""
  import jax
  import jax.numpy as jnp

  from andrea_jax import step as step_lib

  def row_loss(params, row):
    one = jax.tree.map(lambda x: x[None], row)
    loss_BxT, mask_BxT = step_lib.token_losses(model, params, one, document_mask)
    return loss_BxT.sum() / jnp.maximum(mask_BxT.sum(), 1.0), mask_BxT.sum()

  def f(params, batch):
    rows = {k: batch[k] for k in ("inputs", "targets", "segment_ids", "positions")}
    g, tokens = jax.vmap(lambda r: jax.grad(row_loss, has_aux=True)(params, r))(rows)
    return g, tokens
  return jax.jit(f)


def halves(source_ids: np.ndarray, num_sources: int) -> tuple[np.ndarray, np.ndarray]:
  """Row weights ``[S, B]`` of two disjoint halves of each source's rows (alternate rows in batch
  order; each half's weights sum to 1, or are all 0 where a source has fewer than two rows)."""
  a = np.zeros((num_sources, len(source_ids)))
  b = np.zeros_like(a)
  for s in range(num_sources):
    idx = np.flatnonzero(source_ids == s)
    if len(idx) < 2:
      continue
    ia, ib = idx[0::2], idx[1::2]
    a[s, ia] = 1.0 / len(ia)
    b[s, ib] = 1.0 / len(ib)
  return a, b


def make_gauss_newton(model, document_mask: bool):
  """``gnvp(params, batch, v) -> G v``: the Gauss-Newton matrix of the batch's token-mean
  cross-entropy, ``G = J^T (diag(p) - p p^T) J / N`` (``J`` the logits' Jacobian, ``p`` the
  softmax, ``N`` the tokens that count), times ``v`` (a ``jax.jvp`` and a ``jax.vjp``)."""
  import jax
  import jax.numpy as jnp

  def gnvp(params, batch, v):
    segment_ids = batch["segment_ids"] if document_mask else None
    f = lambda p: model.apply({"params": p}, batch["inputs"], segment_ids=segment_ids,
                              positions=batch["positions"]).astype(jnp.float32)
    logits, u = jax.jvp(f, (params,), (v,))
    prob = jax.nn.softmax(logits, axis=-1)
    mask = (batch["segment_ids"] > 0).astype(jnp.float32)[..., None]
    hu = (prob * u - prob * (prob * u).sum(-1, keepdims=True)) * mask / jnp.maximum(mask.sum(), 1)
    _, back = jax.vjp(f, params)
    return back(hu)[0]
  return gnvp


def influence_solve(gnvp, params, batch, diag_pinv, lam: float, rhs, iters: int,
                    tol: float = CG_TOL):
  """``(G + lam diag(diag_pinv))^{-1} rhs`` by at most ``iters`` conjugate-gradient iterations
  (``jax.scipy.sparse.linalg.cg``) preconditioned with ``1 / diag_pinv`` (pytrees of the
  parameters' shape)."""
  import jax
  import jax.scipy.sparse.linalg as jsl
  op = lambda v: jax.tree.map(lambda gv, d, x: gv + lam * d * x, gnvp(params, batch, v),
                              diag_pinv, v)
  precond = lambda v: jax.tree.map(lambda d, x: x / (lam * d), diag_pinv, v)
  x, _ = jsl.cg(op, rhs, tol=tol, maxiter=iters, M=precond)
  return x


def make_influence(model, document_mask: bool, iters: int, tol: float = CG_TOL,
                   gn_rows: int | None = None, source_batch: int | None = None) -> Callable:
  """The measurement, compiled once: ``f(params, opt_state, batch, num_sources, lam, eps, b2) ->
  (b [S], first [S])``.

  ``batch`` holds numpy arrays (``source_ids`` among them); ``b`` is the truncated-horizon
  influence (the module's docstring), ``first`` the first order at the same horizon, ``w_s <g_s^A,
  P g_s^B> / lam`` (for the record). ``G`` is read on the first ``gn_rows`` rows of the batch
  (``None``: all of them); the gradients always on all. A source with fewer than two rows gets 0.
  The sources' solves run ``source_batch`` at a time (``jax.lax.map``; ``None``: all at once):
  each holds a few vectors of the parameters' size, so on a large model solve fewer at once.
  """
  import jax
  import jax.numpy as jnp
  row_grads = make_row_grads(model, document_mask)
  gnvp = make_gauss_newton(model, document_mask)
  if source_batch is not None and source_batch < 1:
    raise ValueError(f"source_batch must be None or >= 1, got {source_batch!r}")
  solve_all = jax.jit(lambda p, bt, d, l, rhs_S: jax.lax.map(
      lambda r: influence_solve(gnvp, p, bt, d, l, r, iters, tol), rhs_S,
      batch_size=source_batch))
  forms = jax.jit(lambda a_S, x_S: sum(
      (a * x).reshape(a.shape[0], -1).sum(-1)
      for a, x in zip(jax.tree.leaves(a_S), jax.tree.leaves(x_S))))

  def f(params, opt_state, batch: dict, num_sources: int, lam: float, eps: float, b2: float):
    if not (lam > 0 and np.isfinite(lam)):
      raise ValueError(f"lam must be a finite number > 0, got {lam!r}")
    precond = adam_preconditioner(opt_state, eps, b2)
    if precond is None:
      raise ValueError("the optimizer state has made no update yet: measure after step 1")
    g_B, tokens_B = row_grads(params, batch)
    src = np.asarray(batch["source_ids"])
    tok = np.asarray(tokens_B, np.float64)
    share = np.bincount(src, weights=tok, minlength=num_sources) / tok.sum()
    wa, wb = (jnp.asarray(w, jnp.float32) for w in halves(src, num_sources))
    ga = jax.tree.map(lambda g: jnp.tensordot(wa, g, axes=1), g_B)     # [S, ...]
    gb = jax.tree.map(lambda g: jnp.tensordot(wb, g, axes=1), g_B)
    diag_pinv = jax.tree.map(lambda p: 1.0 / p, precond)
    rows = slice(None) if gn_rows is None else slice(0, int(gn_rows))
    gn_batch = {k: jnp.asarray(v[rows]) for k, v in batch.items()}
    x = solve_all(params, gn_batch, diag_pinv, jnp.float32(lam), gb)
    est = share * np.asarray(forms(ga, x), np.float64)
    first = share * np.asarray(forms(ga, jax.tree.map(lambda g, p: g * p[None], gb, precond)),
                               np.float64) / lam
    return est, first
  return f


def influence(model, document_mask: bool, params, opt_state, batch: dict, num_sources: int,
              lam: float, eps: float, b2: float, iters: int = 100, tol: float = CG_TOL,
              gn_rows: int | None = None,
              source_batch: int | None = None) -> tuple[np.ndarray, np.ndarray]:
  """One measurement (:func:`make_influence`, compiled for this call alone)."""
  return make_influence(model, document_mask, iters, tol, gn_rows, source_batch)(
      params, opt_state, batch, num_sources, lam, eps, b2)


def measurement_tokens(num_sources: int, rows: int, seq_len: int, iters: int,
                       gn_rows: int | None = None) -> int:
  """A measurement's cost in tokens of training-step compute (a forward and a backward pass per
  token, as a step spends): the per-row gradients of ``rows`` rows, and for each source at most
  ``iters + 1`` Gauss-Newton products (a ``jvp`` and a ``vjp`` of the logits, about a forward and a
  backward pass) on ``gn_rows`` rows (``None``: all). An upper bound: the conjugate gradients stop
  early once the residual is under the tolerance."""
  gn = rows if gn_rows is None else min(int(gn_rows), rows)
  return (rows + num_sources * (iters + 1) * gn) * seq_len


def pilot(config, steps: Sequence[int], *, batches: int = 4, iters: int = 10,
          tol: float = CG_TOL, gn_rows: int | None = None, source_batch: int | None = None,
          log: Callable[[str], None] | None = None) -> dict:
  """Trains ``config`` (its own mixture: make it uniform) from step 0 and measures the influence of
  its state at each of ``steps`` on the batches of that step and the ``batches - 1`` after it
  (which it then trains on; the windows of two measurements may overlap), with ``lambda = 1 /
  sum_{t' < t} lr_{t'}`` of the run's own schedule (``gn_rows``, ``source_batch``: as for
  :func:`make_influence`).
  Stops after the last batch measured.

  Returns ``{"b": [S] mean over the measurements, "sources", "measurements": [{"step", "lambda",
  "b", "first_order"}], "steps_run", "train_s", "measure_s"}`` (``train_s``: the training steps'
  wall, compilation included; ``measure_s``: the measurements').
  """
  import jax

  from andrea_jax import curriculum, data, runconfig, step, train
  steps = sorted(int(t) for t in steps)
  if not steps or steps[0] < 1 or len(set(steps)) != len(steps):
    raise ValueError(f"steps must be distinct steps >= 1, got {list(steps)!r}")
  if batches < 1 or iters < 1:
    raise ValueError(f"batches and iters must be >= 1, got {batches!r} and {iters!r}")
  run = runconfig.build(config)
  last = steps[-1] + batches
  if last > int(config.train.num_steps):
    raise ValueError(f"the last measurement reads the batches of steps {steps[-1]}..{last - 1}, "
                     f"past train.num_steps = {int(config.train.num_steps)}")
  corpus = data.open_training_data(run.data, required=run.evaluated, progress=False)
  sampler = data.MixtureSampler(corpus, seq_len=config.data.seq_len,
                                global_batch_size=config.data.global_batch_size,
                                seed=config.seed)
  state = train.init_state(run, train.run_keys(config.seed))
  train_step = step.jit_step(run.step)
  sc = run.step
  measure = make_influence(sc.model, sc.document_mask, iters, tol, gn_rows, source_batch)
  eps, b2 = float(config.optim.eps), float(config.optim.b2)
  num = len(run.sources)
  lr_sum, out, active = 0.0, [], []
  train_s = measure_s = 0.0
  for t in range(last):
    w_S = np.asarray(curriculum.weights_at(curriculum.schedule(state.curriculum), t), np.float64)
    batch = sampler.batch(t, w_S)
    if t in steps:      # the step donates the state: keep copies of what is measured
      if not lr_sum > 0:
        raise ValueError(f"the learning rate sums to {lr_sum!r} before step {t}: the horizon "
                         "1 / sum lr is undefined there; measure later")
      active.append({"step": t, "lambda": 1.0 / lr_sum, "batches": [],
                     "params": jax.tree.map(lambda x: x.copy(), state.params),
                     "opt_state": jax.tree.map(lambda x: x.copy(), state.opt_state)})
    for snap in list(active):
      snap["batches"].append(jax.tree.map(np.asarray, batch))
      if len(snap["batches"]) == batches:
        m0 = time.time()
        big = {k: np.concatenate([b[k] for b in snap["batches"]]) for k in batch}
        est, first = measure(snap["params"], snap["opt_state"], big, num, snap["lambda"], eps,
                             b2)
        measure_s += time.time() - m0
        out.append({"step": snap["step"], "lambda": snap["lambda"], "b": est.tolist(),
                    "first_order": first.tolist()})
        if log is not None:
          log(f"measured the state of step {snap['step']} ({time.time() - m0:.0f} s)")
        active.remove(snap)
    s0 = time.time()
    lr_sum += float(sc.schedule(t))
    state, metrics = train_step(state, batch)
    jax.block_until_ready(metrics["loss"])
    train_s += time.time() - s0
  return {"b": np.mean([m["b"] for m in out], axis=0).tolist(), "sources": list(run.sources),
          "measurements": out, "steps_run": last, "train_s": train_s, "measure_s": measure_s}
