r"""Can the gradients replace the probes? Screens of data elasticities read off one run's gradients.

    python -m study.mixing.gradient_probe [--out runs/gradient_probe] [--seed 100] [--every 10]

The designed proxy (``python -m study.mixing.fit_proxy``) pays for its elasticities with 20 probe
runs, ten runs' worth at the proxy's size; three probe-free stand-ins (two count models, the target
run probing itself with designed shares) failed their screens because the *losses* of one run are
too noisy to separate a source's own effect from the common fall. This screen reads the same
quantity off the *gradients* instead, to first order.

The elasticity is ``b_s = -dL_s / d ln w_s``: how much source ``s``'s loss falls when its share of
the batches grows by a factor ``e``. To first order in the updates, AdamW's step ``t`` moves the
weights by ``-lr_t c_t P_t sum_j w_j g_j(t)`` (``g_j`` the mean gradient of source ``j``'s tokens in
the batch, ``w_j`` its token share, ``c_t`` the global-norm clip factor, ``P_t = 1 / (sqrt(v_t) +
eps)`` Adam's diagonal preconditioner, bias-corrected), so the part of source ``s``'s loss that its
own rows remove over the steps ``[t_0, t_1)`` is

.. math::  \hat b_s = \sum_t lr_t\, c_t\, w_s\, \langle g_s^A(t), P_t\, g_s^B(t) \rangle

with ``g_s^A`` and ``g_s^B`` the gradients of two disjoint halves of the source's rows in the batch
(independent draws: their inner product estimates ``<E g_s, P E g_s>`` without the self-term's
noise, which would credit the noisiest sources), and it is linear in ``w_s``, so it is also
``-dL_s / d ln w_s`` at first order. It is measured every ``--every`` steps on the batch the step
is about to train on (per-row gradients, ``jax.vmap``), each measurement standing for the
``--every`` steps around it. The cross terms ``<g_j^A, P g_s^B>`` (what source ``j``'s rows do to
source ``s``'s loss: the transfer the own-share probes leave out) and DoGE's value of a source for
the equal-weight mean loss (Fan et al. 2023, ``V_j = mean_s <g_j^A, P g_s^B>``) are printed for the
record. The run is the study's uniform arm (0.13M parameters, 800 steps of 32 x 64 tokens, its
learning-rate schedule) stopped at step 400, the end of the window the recipe holds its mixture.

The rule, fixed before any number was seen (this file's first commit): the first-order fit over
steps 20-399 at the tuning seed (100, never a reported one) stands in for the probes if its mixture
at power 1.5 (``proxy.elasticity_mixture(b_hat, power=1.5)``, the floor 0.02 nats as for the
probes: ``b_hat`` is in the same units) has Pearson r >= 0.9 with the 0.13M half-length probes'
(``PROXY_HALF_ELASTICITY``, the fit behind the 23.4% arm ``proxy_half_p15_early``). Printed for the
record, deciding nothing: the same fit over steps 20-99 only (what an online mixer would know by
step 100, scaled to the window by 380 / 80), DoGE's value, and each fit's r on the raw ``b``.
Should it pass, the next step, also fixed now: an arm at 0.13M, seeds 0-2, that measures under
uniform batches over steps 20-99, holds ``elasticity_mixture(b_hat_early, power=1.5)`` over steps
100-399 and uniform after, against uniform.

Found (``study/mixing/LOG.md``, "Can the gradients replace the probes?"): it fails, r 0.47 (0.62 on
the raw ``b``; DoGE's value 0.34). The first-order sums are 25 to 900 times the probes' ``b`` and
rank `extra-01` (arithmetic) first: at Adam's step sizes the loss is far from linear along the
update, and a source whose iterates bounce across a narrow valley keeps a large, consistent
gradient that the linear sum counts as progress at every step.

**The second screen, ``--method displacement``** (its rule fixed after the first screen's numbers
and before its own: this file's second commit). What a source's rows *did* over a window, not what
a linear model says each step did: over each window of ``--window`` steps ``[t_0, t_1)`` every
step's update is split by source (``g_s`` now the mean gradient of all of the source's rows in the
step's batch; consecutive bounces cancel in the sum) *through Adam's momentum*: each source's share
of the first moment, ``m_s <- b1 m_s + (1 - b1) c_t w_s g_s``, tracked from step 0, sums to the
optimizer's own ``m``, so ``D_s = -sum_t lr_t m_hat_s(t) / (sqrt(v_hat_t) + eps)`` over the window
adds up to its real update, weight decay aside (the first version split the raw gradients,
``-lr_t c_t w_s P_t g_s``; in a 60-step trial that split did not add up, 0.9 nats off the real
loss, and it was corrected before the full run). The source's own gain is then measured exactly,
not to first order: ``L_s(theta_{t_0}) -
L_s(theta_{t_0} + D_s)`` on the source's rows of the batch of step ``t_1`` (rows no step of the
window trained on). ``b_hat_s`` is the sum of the gains over the windows in steps 20-399 (with
``--window 20``: 19 windows); how well the split adds up is printed for the record (the loss at
``theta_{t_0} + sum_s D_s`` against the loss at ``theta_{t_1}``). The rule is the first's: Pearson
r >= 0.9 of its power-1.5 mixture with ``PROXY_HALF_ELASTICITY``'s, at seed 100; the next step if it
passes, the first's (the fit over steps 20-99 held over steps 100-399, then uniform, seeds 0-2).

Found: it fails. Every source's own displacement *raises* its loss when taken alone (gains -1.7 to
-24 nats summed over the windows; the split adds up, 0.001 nats off the real loss): over a window
a source's update is largely a repair of what the other sources' updates do to it, and taken
without them the repair overshoots.

**The third screen, ``--gain loo``** (fixed after the second's numbers and before its own run: this
file's fourth commit). The same split, read the other way round, which keeps each repair with what
it repairs: leave one source out at the end of the window, ``gain_s = L_s(theta_{t_1} - D_s) -
L_s(theta_{t_1})`` on the same unseen rows: how much worse the source would be had its rows'
share of the window's update not been taken. Same rule, same reference, same next step.

Found: it fails, r 0.35: left out, the same repairs make every source look indispensable, the
noise source most (its rows hold its predictions flat against the others' pull).

**The fourth screen, ``--method influence``** (fixed after the third's numbers and before its own
run: this file's sixth commit). A change of share moves the *balance* between the sources' tugs,
and the balance point's response is the influence function: at a minimum of the mixture's loss,
``dL_s / d ln w_s = -w_s g_s^T H^{-1} g_s`` (``H`` the Hessian of the mixture's training loss).
A run of finite length is at that balance only in the directions it has had time to settle:
under Adam's preconditioned flow, ``theta' = -lr P grad L``, a direction of curvature ``h``
(of ``P^{1/2} H P^{1/2}``) settles when ``h sum_t lr_t >~ 1``. So the estimate, with no free
parameter (AdamW's decoupled weight decay, which would add ``wd P^{-1}`` to the matrix, is left
out), is the truncated-horizon influence

.. math::  \hat b_s = w_s\, (g_s^A)^T (G + \lambda P^{-1})^{-1} g_s^B,
   \qquad \lambda = 1 / \sum_{t' < t} lr_{t'}

which is the first-order sum's ``w_s lr T <g^A, P g^B>`` in the directions that have not settled
and the balance point's response in those that have. ``G`` is the Gauss-Newton matrix of the
mixture's token-mean training loss (positive semi-definite, so conjugate gradients solve the
system: preconditioned with ``P``, at most 100 iterations, relative residual 1e-3), ``P`` Adam's
bias-corrected ``1 / (sqrt(v) + eps)``, ``g^A``, ``g^B`` two halves of each source's rows; ``G``,
``g^A`` and ``g^B`` are read on the four batches of steps ``t .. t + 3`` (128 rows, 8 of each
source) of the uniform run at ``t = 300, 325, 350, 375`` (the window the probes are fitted on),
and the four estimates are averaged. Same rule (r >= 0.9 of its power-1.5 mixture with
``PROXY_HALF_ELASTICITY``'s at seed 100), same reference. Its cost (tens of Gauss-Newton products
per source and measurement) is far past 1% of a run on this testbed: a pass would say what to make
cheap, not a recipe yet.

Found: it passes, r 0.93 (r 0.90 on the raw ``b``, and in the probes' units: 0.03 to 0.45 nats
against their -0.05 to 0.59; the first order at the same horizon, for the record, r 0.78, 9 to 59
nats). The one source it gets wrong is ``repo-docs`` (0.18 against the probes' 0.00), whose
memorised passages the probes' fit finds worth nothing. It cost 1,224 s of solves for the four
measurements (16 sources x up to 100 Gauss-Newton products on 128 rows each), 30 runs of this
model. The mixer that uses it: ``study/mixing/influence_mixer.py``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import time
from collections.abc import Sequence

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

BURN_IN = 20       # the first steps learn the byte distribution (and Adam's v is not yet settled)
EARLY_END = 100    # what an online mixer would know by then
POWER = 1.5
THRESHOLD = 0.9

# The estimator's pieces live in the package (``python -m study.mixing.fit_proxy --method influence``
# runs the pilot); the screens below use them from there.
from study.mixing.influence import (
    adam_preconditioner,
    halves,
    influence,
    make_gauss_newton,
    make_row_grads,
)


def load_bench(name: str):
  """The study's module ``name`` (``compare_mixers`` is :mod:`study.mixing.compare`)."""
  return importlib.import_module(f"study.mixing.{'compare' if name == 'compare_mixers' else name}")


def uniform_run(cfg):
  """The pieces of a hand-driven run of ``cfg`` (the README's own loop): ``(cfg, run, sampler,
  state, train_step)``, the state at step 0 and the step jitted with the state donated."""
  from andrea_jax import data, runconfig, step, train
  run = runconfig.build(cfg)
  corpus = data.open_training_data(run.data, required=run.evaluated)
  sampler = data.MixtureSampler(corpus, seq_len=cfg.data.seq_len,
                                global_batch_size=cfg.data.global_batch_size, seed=cfg.seed)
  state = train.init_state(run, train.run_keys(cfg.seed))
  return cfg, run, sampler, state, step.jit_step(run.step)


def cross_products(grads_B, precond, wa_SxB: np.ndarray, wb_SxB: np.ndarray) -> np.ndarray:
  """``M [S, S]``: ``M[j, s] = <g_j^A, P g_s^B>``, the half-batch gradients built from the row
  gradients ``grads_B`` with the weights ``wa`` and ``wb``."""
  import jax
  import jax.numpy as jnp
  wa = jnp.asarray(wa_SxB, jnp.float32)
  wb = jnp.asarray(wb_SxB, jnp.float32)
  total = 0.0
  for g, p in zip(jax.tree.leaves(grads_B), jax.tree.leaves(precond)):
    flat = g.reshape(g.shape[0], -1)                       # [B, n]
    ga = wa @ flat                                         # [S, n]
    gb = wb @ flat
    total = total + (ga * p.reshape(1, -1)) @ gb.T         # [S, S]
  return np.asarray(total, np.float64)


def source_weights(source_ids: np.ndarray, tokens: np.ndarray, num_sources: int) -> np.ndarray:
  """Row weights ``[S, B]`` that average each source's rows by tokens (rows of no token count
  nothing; a source with no row has all zeros)."""
  w = np.zeros((num_sources, len(source_ids)))
  w[source_ids, np.arange(len(source_ids))] = tokens
  total = w.sum(axis=1, keepdims=True)
  return np.divide(w, total, out=np.zeros_like(w), where=total > 0)


def source_grads(grads_B, weights_SxB: np.ndarray, scale_S: np.ndarray):
  """Per source, ``scale_s g_s`` with ``g_s = sum_b weights[s, b] grads[b]``: a pytree whose
  leaves have a leading axis ``S`` (numpy)."""
  import jax
  w = np.asarray(weights_SxB * scale_S[:, None], np.float32)
  return jax.tree.map(lambda g: np.tensordot(w, np.asarray(g), axes=1), grads_B)


def split_adam_step(mom_S, nu, g_S, clip_factor: float, lr: float, count: int, b1: float,
                    b2: float, eps: float):
  """One AdamW step split by source (weight decay aside). ``g_S`` holds each source's part of the
  step's gradient (leading axis ``S``, summing to the gradient), ``mom_S`` each source's part of
  the first moment, ``nu`` the (unsplit) second moment, ``count`` the step's 1-based count.

  Returns ``(mom_S, nu, update_S)``: ``m_s <- b1 m_s + (1 - b1) c g_s``, ``v <- b2 v + (1 - b2)
  (c sum_s g_s)^2`` and ``update_s = -lr (m_s / (1 - b1^k)) / (sqrt(v / (1 - b2^k)) + eps)``,
  whose sum over the sources is AdamW's update of the clipped gradient ``c sum_s g_s``.
  """
  import jax
  mom_S = jax.tree.map(lambda m, g: b1 * m + (1 - b1) * clip_factor * g, mom_S, g_S)
  nu = jax.tree.map(lambda v, g: b2 * v + (1 - b2) * np.square(clip_factor * g.sum(0)), nu, g_S)
  upd = jax.tree.map(
      lambda m, v: -lr * (m / (1 - b1 ** count)) / (np.sqrt(v / (1 - b2 ** count)) + eps)[None],
      mom_S, nu)
  return mom_S, nu, upd


def make_source_losses(model, num_sources: int, document_mask: bool):
  """``f(params, batch) -> [S]``: each source's mean token loss on the batch (NaN where it has no
  token)."""
  import jax
  import jax.numpy as jnp

  from andrea_jax import step as step_lib

  def f(params, batch):
    loss_S, tokens_S = step_lib.eval_losses(model, params, batch, num_sources, document_mask)
    return jnp.where(tokens_S > 0, loss_S / jnp.maximum(tokens_S, 1.0), jnp.nan)
  return jax.jit(f)


INFLUENCE_STEPS = (300, 325, 350, 375)
INFLUENCE_BATCHES = 4          # the batches of steps t .. t + 3
CG_ITERS, CG_TOL = 100, 1e-3


def lanczos(matvec, start: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
  """``k`` steps of Lanczos on the symmetric ``matvec`` (flat float64 vectors) from ``start``,
  with full reorthogonalisation: ``Q [n, k']`` orthonormal and ``T [k', k']`` tridiagonal,
  ``T = Q^T A Q`` (``k' <= k``: fewer when the Krylov space closes)."""
  q = start / np.linalg.norm(start)
  qs, alphas, betas = [q], [], []
  for j in range(k):
    w = matvec(qs[-1])
    alphas.append(float(qs[-1] @ w))
    basis = np.stack(qs, axis=1)
    w = w - basis @ (basis.T @ w)
    w = w - basis @ (basis.T @ w)             # twice: float32 products lose orthogonality fast
    beta = float(np.linalg.norm(w))
    if j == k - 1 or beta < 1e-10 * max(1.0, abs(alphas[-1])):
      break
    betas.append(beta)
    qs.append(w / beta)
  t = np.diag(alphas) + np.diag(betas[:len(alphas) - 1], 1) + np.diag(betas[:len(alphas) - 1], -1)
  return np.stack(qs[:len(alphas)], axis=1), t


def lowrank_forms(q: np.ndarray, t: np.ndarray, lam: float, a_SxN: np.ndarray,
                  b_SxN: np.ndarray) -> np.ndarray:
  """``a_s^T (A + lam I)^{-1} b_s`` per row ``s``, with ``A`` known on the span of ``q`` (``Q^T A Q
  = T``) and taken as 0 off it: ``(Q^T a)^T (T + lam I)^{-1} (Q^T b) + (a^T b - (Q^T a)^T (Q^T
  b)) / lam``."""
  qa, qb = a_SxN @ q, b_SxN @ q                             # [S, k]
  inner = np.einsum("sk,sk->s", qa, np.linalg.solve(t + lam * np.eye(len(t)), qb.T).T)
  return inner + (np.einsum("sn,sn->s", a_SxN, b_SxN) - np.einsum("sk,sk->s", qa, qb)) / lam


def influence_lowrank(model, document_mask: bool, params, opt_state, batch: dict,
                      num_sources: int, lam: float, eps: float, b2: float, rank: int,
                      start: str = "gradient", seed: int = 0) -> np.ndarray:
  """The truncated-horizon influence ``[S]`` with the preconditioned Gauss-Newton matrix
  ``P^{1/2} G P^{1/2}`` replaced by its ``rank``-step Lanczos projection (``rank`` products in
  all, for every source at once): exact in the directions the Krylov space holds, the first order
  (``1 / lam``) off it. ``start``: ``"gradient"`` (the preconditioned sum of the sources' half
  gradients) or ``"random"``."""
  import jax
  import jax.flatten_util
  import jax.numpy as jnp
  row_grads = make_row_grads(model, document_mask)
  gnvp = jax.jit(make_gauss_newton(model, document_mask))
  g_B, tokens_B = row_grads(params, batch)
  src = np.asarray(batch["source_ids"])
  tok = np.asarray(tokens_B, np.float64)
  share = np.bincount(src, weights=tok, minlength=num_sources) / tok.sum()
  wa, wb = halves(src, num_sources)
  flat_B = np.asarray(jax.vmap(lambda g: jax.flatten_util.ravel_pytree(g)[0])(g_B), np.float64)
  _, unravel = jax.flatten_util.ravel_pytree(params)
  root_p = np.sqrt(np.asarray(jax.flatten_util.ravel_pytree(
      adam_preconditioner(opt_state, eps, b2))[0], np.float64))   # P^{1/2}
  a, b = (wa @ flat_B) * root_p, (wb @ flat_B) * root_p           # [S, n], preconditioned
  batch_j = {k: jnp.asarray(v) for k, v in batch.items()}

  def matvec(v):   # P^{1/2} G P^{1/2} v
    out = gnvp(params, batch_j, unravel(jnp.asarray(root_p * v, jnp.float32)))
    return root_p * np.asarray(jax.flatten_util.ravel_pytree(out)[0], np.float64)
  r0 = (a + b).sum(0) if start == "gradient" else \
      np.random.default_rng(seed).normal(size=root_p.size)
  q, t = lanczos(matvec, r0, rank)
  return share * lowrank_forms(q, t, lam, a, b)


def influence_main(args) -> int:
  """The fourth screen (see the module's docstring)."""
  import jax

  from andrea_jax import curriculum
  from study.mixing import proxy

  cm = load_bench("compare_mixers")
  exp = cm.load_experiment()
  cfg, run, sampler, state, train_step = uniform_run(exp.arm_config("uniform", seed=args.seed))
  sources = list(run.sources)
  num = len(sources)
  model, doc = run.step.model, run.step.document_mask
  schedule = run.step.schedule
  eps, b2 = float(cfg.optim.eps), float(cfg.optim.b2)

  lr_sum, estimates, solve_s = 0.0, [], 0.0
  t0 = time.time()
  last = max(INFLUENCE_STEPS) + INFLUENCE_BATCHES
  pending = []
  for t in range(last):
    w_S = np.asarray(curriculum.weights_at(curriculum.schedule(state.curriculum), t), np.float64)
    batch = sampler.batch(t, w_S)
    if t in INFLUENCE_STEPS:
      params_t = jax.tree.map(lambda x: x.copy(), state.params)
      opt_state_t = jax.tree.map(lambda x: x.copy(), state.opt_state)
      lam_t = 1.0 / lr_sum
      pending = []
    if t - max([s for s in INFLUENCE_STEPS if s <= t], default=-10) < INFLUENCE_BATCHES:
      pending.append(jax.tree.map(np.asarray, batch))
      if len(pending) == INFLUENCE_BATCHES:
        m0 = time.time()
        big = {k: np.concatenate([b[k] for b in pending]) for k in pending[0]}
        est, first = influence(model, doc, params_t, opt_state_t, big, num, lam_t, eps, b2)
        estimates.append({"step": t - INFLUENCE_BATCHES + 1, "lambda": lam_t, "b": est.tolist(),
                          "first_order_same_horizon": first.tolist()})
        solve_s += time.time() - m0
    lr_sum += float(schedule(t))
    state, _ = train_step(state, batch)
  wall = time.time() - t0

  b_hat = np.mean([e["b"] for e in estimates], axis=0)
  first = np.mean([e["first_order_same_horizon"] for e in estimates], axis=0)
  ref = np.asarray(exp.PROXY_HALF_ELASTICITY, np.float64)
  ref_mix = proxy.elasticity_mixture(ref, power=POWER)

  def agree(est):
    if not np.isfinite(est).all():
      return float("nan"), float("nan")
    return (float(np.corrcoef(proxy.elasticity_mixture(est, power=POWER), ref_mix)[0, 1]),
            float(np.corrcoef(est, ref)[0, 1]))
  table = [["source", "half-length probes' b", "truncated-horizon influence",
            "first order at the same horizon (record)"]]
  for k, s in enumerate(sources):
    table.append([s, f"{ref[k]:+.3f}", f"{b_hat[k]:+.3f}", f"{first[k]:+.3f}"])
  print(cm.markdown_table(table))
  r15, rb = agree(b_hat)
  f15, fb = agree(first)
  passed = r15 >= THRESHOLD
  lams = ", ".join(f"{e['lambda']:.3g}" for e in estimates)
  print(f"\ninfluence: r(mixture^{POWER}) {r15:+.2f}, r(b) {rb:+.2f}; first order at the same "
        f"horizon: {f15:+.2f}, {fb:+.2f}; lambda {lams}")
  print(f"seed {args.seed}, steps 0-{last - 1} in {wall:.0f} s ({solve_s:.0f} s of it in "
        f"{len(estimates)} measurements): r {r15:+.2f} {'>=' if passed else '<'} {THRESHOLD}: "
        f"{'passes the screen' if passed else 'fails the screen'}")
  os.makedirs(args.out, exist_ok=True)
  with open(os.path.join(args.out, f"influence_seed{args.seed}.json"), "w") as f:
    json.dump({"seed": args.seed, "wall_s": wall, "passed": passed, "r_mixture_p15": r15,
               "r_b": rb, "b": b_hat.tolist(), "reference": ref.tolist(),
               "measurements": estimates}, f)
  return 0


def displacement_main(args) -> int:
  """The second screen (see the module's docstring)."""
  import jax
  import optax

  from andrea_jax import curriculum
  from study.mixing import proxy

  cm = load_bench("compare_mixers")
  exp = cm.load_experiment()
  cfg, run, sampler, state, train_step = uniform_run(exp.arm_config("uniform", seed=args.seed))
  sources = list(run.sources)
  num = len(sources)
  row_grads = make_row_grads(run.step.model, run.step.document_mask)
  source_losses = make_source_losses(run.step.model, num, run.step.document_mask)
  schedule = run.step.schedule
  clip = float(cfg.optim.grad_clip)

  b1, b2, eps = float(cfg.optim.b1), float(cfg.optim.b2), float(cfg.optim.eps)
  gains, windows = np.zeros(num), []
  theta0 = disp = None
  mom = jax.tree.map(lambda x: np.zeros((num,) + x.shape, np.float32), state.params)
  nu = jax.tree.map(lambda x: np.zeros(x.shape, np.float32), state.params)
  t0 = time.time()
  for t in range(args.stop + 1):
    w_S = np.asarray(curriculum.weights_at(curriculum.schedule(state.curriculum), t), np.float64)
    batch = sampler.batch(t, w_S)
    at_edge = t >= BURN_IN and (t - BURN_IN) % args.window == 0
    if at_edge and disp is not None:
      # the window [t - window, t) ends: its gains on this (untrained) batch
      base = np.asarray(source_losses(theta0, batch), np.float64)
      together = np.asarray(source_losses(
          jax.tree.map(lambda p, d: p + d.sum(0), theta0, disp), batch), np.float64)
      actual = np.asarray(source_losses(state.params, batch), np.float64)
      if args.gain == "alone":
        moved = np.array([float(source_losses(
            jax.tree.map(lambda p, d: p + d[s], theta0, disp), batch)[s]) for s in range(num)])
        gain = base - moved
      else:
        left_out = np.array([float(source_losses(
            jax.tree.map(lambda p, d: p - d[s], state.params, disp), batch)[s])
                             for s in range(num)])
        gain = left_out - actual
      gain = np.where(np.isfinite(gain), gain, 0.0)
      gains += gain
      windows.append({"start": t - args.window, "gain": gain.tolist(), "base": base.tolist(),
                      "split_sum": together.tolist(), "actual": actual.tolist()})
    if t == args.stop:
      break
    if at_edge:
      theta0 = jax.tree.map(lambda x: x.copy(), state.params)
      disp = jax.tree.map(lambda x: np.zeros((num,) + x.shape, np.float32), state.params)
    # Adam's moments, the first split by source, from step 0 (so that the split sums to m)
    g_B, tokens_B = row_grads(state.params, batch)
    src = np.asarray(batch["source_ids"])
    tok = np.asarray(tokens_B, np.float64)
    share = np.bincount(src, weights=tok, minlength=num) / tok.sum()
    g_S = source_grads(g_B, source_weights(src, tok, num), share)   # sums to the step's gradient
    norm = float(optax.tree_utils.tree_norm(jax.tree.map(lambda g: g.sum(0), g_S)))
    c = min(1.0, clip / norm) if clip > 0 and norm > 0 else 1.0
    mom, nu, upd = split_adam_step(mom, nu, g_S, c, float(schedule(t)), t + 1, b1, b2, eps)
    if disp is not None:
      disp = jax.tree.map(np.add, disp, upd)
    state, metrics = train_step(state, batch)
  wall = time.time() - t0

  ref = np.asarray(exp.PROXY_HALF_ELASTICITY, np.float64)
  ref_mix = proxy.elasticity_mixture(ref, power=POWER)
  r15 = float(np.corrcoef(proxy.elasticity_mixture(gains, power=POWER), ref_mix)[0, 1])
  rb = float(np.corrcoef(gains, ref)[0, 1])
  early = np.sum([w["gain"] for w in windows if w["start"] < EARLY_END], axis=0) \
      * (args.stop - BURN_IN) / (EARLY_END - BURN_IN)
  r15_early = float(np.corrcoef(proxy.elasticity_mixture(early, power=POWER), ref_mix)[0, 1])
  split_err = np.mean([np.nanmean(np.abs(np.asarray(w["split_sum"]) - np.asarray(w["actual"])))
                       for w in windows])
  fall = np.mean([np.nanmean(np.asarray(w["base"]) - np.asarray(w["actual"])) for w in windows])
  table = [["source", "half-length probes' b", "own gain, steps 20-399",
            "own gain, steps 20-99 (x 380/80)"]]
  for k, s in enumerate(sources):
    table.append([s, f"{ref[k]:+.3f}", f"{gains[k]:+.3f}", f"{early[k]:+.3f}"])
  print(cm.markdown_table(table))
  passed = r15 >= THRESHOLD
  print(f"\nr(mixture^{POWER}) {r15:+.2f}, r(b) {rb:+.2f}; steps 20-99 only: r(mixture^{POWER}) "
        f"{r15_early:+.2f}. Split check: a window's loss fall {fall:.3f} nats on average, the "
        f"summed split's loss off the real one by {split_err:.3f}")
  print(f"seed {args.seed}, steps 0-{args.stop - 1} in {wall:.0f} s, {len(windows)} windows of "
        f"{args.window}: r {r15:+.2f} {'>=' if passed else '<'} {THRESHOLD}: "
        f"{'passes the screen' if passed else 'fails the screen'}")
  os.makedirs(args.out, exist_ok=True)
  with open(os.path.join(args.out, f"displacement_{args.gain}_seed{args.seed}.json"), "w") as f:
    json.dump({"seed": args.seed, "window": args.window, "wall_s": wall, "passed": passed,
               "r_mixture_p15": r15, "r_b": rb, "r_mixture_p15_early": r15_early,
               "b": gains.tolist(), "b_early": early.tolist(), "reference": ref.tolist(),
               "windows": windows}, f)
  return 0


def main(argv: Sequence[str] | None = None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--out", default="runs/gradient_probe")
  p.add_argument("--seed", type=int, default=100, help="the tuning seed (never a reported one)")
  p.add_argument("--every", type=int, default=10, help="steps between two measurements")
  p.add_argument("--stop", type=int, default=400, help="the last step (exclusive) measured")
  p.add_argument("--method", choices=("first_order", "displacement", "influence"),
                 default="first_order")
  p.add_argument("--window", type=int, default=20, help="displacement: steps per window")
  p.add_argument("--gain", choices=("alone", "loo"), default="alone",
                 help="displacement: the source's share of the update taken alone from the "
                 "window's start, or left out at its end")
  args = p.parse_args(argv)
  if args.method == "displacement":
    return displacement_main(args)
  if args.method == "influence":
    return influence_main(args)

  import jax
  import optax

  from andrea_jax import curriculum
  from study.mixing import proxy

  cm = load_bench("compare_mixers")
  exp = cm.load_experiment()
  cfg, run, sampler, state, train_step = uniform_run(exp.arm_config("uniform", seed=args.seed))
  sources = list(run.sources)
  num = len(sources)
  row_grads = make_row_grads(run.step.model, run.step.document_mask)
  schedule = run.step.schedule

  measured = []        # (step, lr * clip, shares [S], M [S, S])
  t0 = time.time()
  measure_s = 0.0
  for t in range(args.stop):
    w_S = np.asarray(curriculum.weights_at(curriculum.schedule(state.curriculum), t), np.float64)
    batch = sampler.batch(t, w_S)
    if t >= BURN_IN and (t - BURN_IN) % args.every == 0:
      m0 = time.time()
      precond = adam_preconditioner(state.opt_state, float(cfg.optim.eps), float(cfg.optim.b2))
      g_B, tokens_B = row_grads(state.params, batch)
      src = np.asarray(batch["source_ids"])
      tok = np.asarray(tokens_B, np.float64)
      wa, wb = halves(src, num)
      mat = cross_products(g_B, precond, wa, wb)
      share = np.bincount(src, weights=tok, minlength=num) / tok.sum()
      # the clip factor of this step's full-batch gradient (token-weighted mean of the rows')
      full = jax.tree.map(lambda g: np.tensordot(tok / tok.sum(), np.asarray(g), axes=1), g_B)
      norm = float(optax.tree_utils.tree_norm(full))
      clip = float(cfg.optim.grad_clip)
      c = min(1.0, clip / norm) if clip > 0 and norm > 0 else 1.0
      measured.append((t, float(schedule(t)) * c, share, mat))
      measure_s += time.time() - m0
    state, metrics = train_step(state, batch)
  float(metrics["loss"])
  wall = time.time() - t0

  def fit(start: int, end: int, scale: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    b = np.zeros(num)
    v = np.zeros(num)
    for t, lr, share, mat in measured:
      if start <= t < end:
        b += args.every * lr * share * np.diag(mat)
        v += args.every * lr * mat.mean(axis=1)
    return b * scale, v * scale

  b_full, v_full = fit(BURN_IN, args.stop)
  b_early, v_early = fit(BURN_IN, EARLY_END, (args.stop - BURN_IN) / (EARLY_END - BURN_IN))
  ref = np.asarray(exp.PROXY_HALF_ELASTICITY, np.float64)
  ref_mix = proxy.elasticity_mixture(ref, power=POWER)

  def agree(est):
    return (float(np.corrcoef(proxy.elasticity_mixture(est, power=POWER), ref_mix)[0, 1]),
            float(np.corrcoef(est, ref)[0, 1]))

  table = [["source", "half-length probes' b", "first-order b, steps 20-399",
            "first-order b, steps 20-99 (x 380/80)", "DoGE value, 20-399"]]
  for k, s in enumerate(sources):
    table.append([s, f"{ref[k]:+.3f}", f"{b_full[k]:+.3f}", f"{b_early[k]:+.3f}",
                  f"{v_full[k]:+.4f}"])
  print(cm.markdown_table(table))
  print()
  verdict = [["estimate", f"r(mixture^{POWER})", "r(b)"]]
  results = {}
  for name, est in (("first-order, steps 20-399 (the rule's)", b_full),
                    ("first-order, steps 20-99", b_early), ("DoGE value, steps 20-399", v_full),
                    ("DoGE value, steps 20-99", v_early)):
    r15, rb = agree(est)
    results[name] = {"b": est.tolist(), "r_mixture_p15": r15, "r_b": rb}
    verdict.append([name, f"{r15:+.2f}", f"{rb:+.2f}"])
  print(cm.markdown_table(verdict))
  r_rule = results["first-order, steps 20-399 (the rule's)"]["r_mixture_p15"]
  passed = r_rule >= THRESHOLD
  steps_measured = len(measured)
  print(f"\nseed {args.seed}, steps 0-{args.stop - 1} in {wall:.0f} s ({measure_s:.0f} s of it in "
        f"{steps_measured} measurements): r {r_rule:+.2f} {'>=' if passed else '<'} {THRESHOLD}: "
        f"{'passes the screen' if passed else 'fails the screen'}")
  os.makedirs(args.out, exist_ok=True)
  with open(os.path.join(args.out, f"screen_seed{args.seed}.json"), "w") as f:
    json.dump({"seed": args.seed, "every": args.every, "wall_s": wall, "measure_s": measure_s,
               "passed": passed, "estimates": results, "reference": ref.tolist(),
               "measurements": [{"step": t, "lr": lr, "share": sh.tolist(), "M": m.tolist()}
                                for t, lr, sh, m in measured]}, f)
  return 0


if __name__ == "__main__":
  sys.exit(main())
