r"""Proxy-fitted mixture schedules: designed probe runs, a per-source elasticity fit, a schedule.

An offline alternative to the online mixers, in the spirit of DoReMi and RegMix (a small proxy
model decides the mixture of a larger one), with the probes laid out as a designed experiment:

1. **Probes** (:func:`probe_mixtures`): ``K`` short runs of a small model, each holding one static
   mixture in which every source gets a *high* or a *low* weight (``sqrt(ratio)`` or
   ``1/sqrt(ratio)`` before normalisation). The high/low pattern is a two-level orthogonal array
   (:func:`probe_design`, the columns of a normalised Hadamard matrix): every source is high in
   exactly half the probes, and any two sources are high together in exactly a quarter, so each
   source's own effect is estimated free of every other source's (to first order in the log
   shares), from ``K`` = the smallest Hadamard order above ``S`` runs (20 for 16 sources).
2. **Fit** (:func:`fit_elasticity`): per source, the late *training* loss of each probe regressed
   by least squares on the log of the share it got, ``l_s = c_s - b_s \ln(S w_s)``: ``b_s`` is the
   source's data elasticity (nats per unit of log share). Under a power law in each source's tokens
   the equal-weight mean loss of a fixed mixture is smallest at shares proportional to ``b``.
3. **Schedule** (:func:`elasticity_mixture`, :func:`proxy_schedule`): that mixture, mixed with
   uniform by ``1 - lam``, held for the first ``hold`` of the run, then the uniform mixture under
   the static strategy, or the mixer under another one (measured in ``python -m study.mixing.compare``:
   the gain is made early, and the uniform part repairs what the mixture cost the sources it
   starved).

Fits made at two or more proxy sizes can be read at the target's size (:func:`scale_elasticity`:
per source, a line in the log of the parameter count). On the built-in corpus a 0.85M proxy
values most sources' rows more than a 0.13M one does (the prose, ``dictionary`` and
``repo-docstrings`` most), but reading the fits at the target's size moved the schedule's gain by
about a point of the steps, within the seeds' spread (``study/mixing/LOG.md``, "A proxy nearer the
target's size"). Sharpening the mixture (``elasticity_mixture(b, power=1.5)``) with the fit
made at the target's size took the uniform mixture's final loss from 19.4% to 23.4% fewer steps
at 0.13M (nine seeds) and from 20.6% to 22.1% at 0.85M (three; 22.9% over six), and gave a 2.76M
model 18.7% (nine seeds) from fits at two sizes read at its size (17.8% unsharpened, unpaired);
the 0.13M fit alone, sharpened, gave 20.2% at 0.85M and 17.4% at 2.76M ("Power 1.5 at every
size").

Everything here is numpy and config: the probes and the run are ordinary training runs
(``python -m study.mixing.fit_proxy`` runs the probes, at half length by default, and writes the
fit; ``python -m study.mixing.compare --fit-proxy`` is the study's whole-probe version).

Example::

  w_KxS = probe_mixtures(16)          # 20 probe mixtures over the 16 sources
  # ... one short small-model run per row; each source's late training loss into loss_KxS ...
  fit = fit_elasticity(w_KxS, loss_KxS)
  curriculum.set_mixer(config, "static")
  config.curriculum.geometries = proxy_schedule(elasticity_mixture(fit.b), num_steps=800)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

import ml_collections
import numpy as np

from andrea_jax.curriculum import geometry
from andrea_jax.sources import SOURCES


def _is_prime(n: int) -> bool:
  return n >= 2 and all(n % d for d in range(2, int(n ** 0.5) + 1))


def hadamard(n: int) -> np.ndarray:
  """A Hadamard matrix of order ``n``: entries +-1 with ``H H^T = n I`` (int8, ``[n, n]``).

  Built by Sylvester's doubling for powers of two and by Paley's first construction for ``n = q +
  1`` with ``q`` a prime congruent to 3 mod 4 (``n`` = 4, 8, 12, 16, 20, 24, 32, 44, 48, ...):
  with the Jacobsthal matrix ``Q_ij = chi(j - i)`` (``chi`` the quadratic character mod ``q``),
  ``H = I + [[0, 1^T], [-1, Q]]``. Normalised: first row and first column all +1.

  Example: ``hadamard(2)`` is ``[[1, 1], [1, -1]]``.
  """
  if not isinstance(n, (int, np.integer)) or n < 1:
    raise ValueError(f"Hadamard order must be a positive integer, got {n!r}")
  if n & (n - 1) == 0:
    h = np.ones((1, 1), np.int64)
    while h.shape[0] < n:
      h = np.block([[h, h], [h, -h]])
  elif _is_prime(n - 1) and (n - 1) % 4 == 3:
    q = n - 1
    residues = {(x * x) % q for x in range(1, q)}
    chi = np.array([0] + [1 if d in residues else -1 for d in range(1, q)], np.int64)
    jacobsthal = chi[(np.arange(q)[None, :] - np.arange(q)[:, None]) % q]
    h = np.eye(n, dtype=np.int64)
    h[0, 1:] += 1
    h[1:, 0] -= 1
    h[1:, 1:] += jacobsthal
  else:
    raise ValueError(f"no Hadamard construction here for order {n} (Sylvester: powers of two; "
                     "Paley: one more than a prime congruent to 3 mod 4)")
  h = h * h[:, :1]   # first column +1
  h = h * h[:1, :]   # first row +1
  return h.astype(np.int8)


def probe_design(num_sources: int) -> np.ndarray:
  """The high (+1) / low (-1) pattern of the probes: ``[K, num_sources]`` int8.

  Columns 1 to ``num_sources`` of the normalised :func:`hadamard` matrix of the smallest order
  ``K > num_sources`` with a construction: each column is balanced (``K/2`` of each sign) and
  orthogonal to every other and to the intercept, so per-source least squares on this design
  separates the sources' effects. Row 0 is all +1 (the uniform mixture).

  Example: ``probe_design(16).shape == (20, 16)``; ``probe_design(3)`` is ``hadamard(4)[:, 1:]``.
  """
  if not isinstance(num_sources, (int, np.integer)) or num_sources < 1:
    raise ValueError(f"num_sources must be a positive integer, got {num_sources!r}")
  order = num_sources + 1
  while True:
    try:
      return hadamard(order)[:, 1:num_sources + 1]
    except ValueError:
      order += 1


def probe_mixtures(num_sources: int = len(SOURCES), ratio: float = 4.0) -> np.ndarray:
  """The probes' static mixtures, ``[K, num_sources]`` float64, rows on the simplex.

  Row ``k`` weighs source ``s`` by ``ratio ** (d_ks / 2)`` (``d`` = :func:`probe_design`), then
  normalises: a high source gets ``ratio`` times the share of a low one in the same probe.

  Example: ``probe_mixtures(3, ratio=4)[2]`` is ``(2, 1/2, 1/2) / 3``.
  """
  if not (isinstance(ratio, (int, float)) and np.isfinite(ratio) and ratio > 1):
    raise ValueError(f"ratio must be a finite number > 1, got {ratio!r}")
  w = float(ratio) ** (probe_design(num_sources).astype(np.float64) / 2)
  return w / w.sum(axis=1, keepdims=True)


class ElasticityFit(NamedTuple):
  """Per-source least-squares fit ``loss = intercept - b ln(S share)`` (arrays ``[S]``)."""
  b: np.ndarray           # nats per unit of log share: how much more of the source pays
  intercept: np.ndarray   # the loss at the uniform share 1/S
  r2: np.ndarray          # coefficient of determination (NaN where the losses do not vary)


def fit_elasticity(shares_KxS: np.ndarray, losses_KxS: np.ndarray) -> ElasticityFit:
  """Each source's data elasticity from ``K`` runs: least squares of ``losses[:, s]`` on ``[1,
  ln(S shares[:, s])]``, ``b_s`` minus the slope.

  Args:
    shares_KxS: the share of the batches each source got in each run (> 0).
    losses_KxS: each source's late training loss in each run (finite).

  Raises ``ValueError`` naming the run and source of a bad entry, or a source whose share never
  varied (its slope is not identified).

  Example: losses ``c_s - b_s ln(S w_s)`` exactly give back ``b_s`` and ``c_s`` with ``R^2 = 1``.
  """
  w = np.asarray(shares_KxS, np.float64)
  y = np.asarray(losses_KxS, np.float64)
  if w.ndim != 2 or w.shape != y.shape:
    raise ValueError(f"shares and losses must both be [runs, sources], got {w.shape} and {y.shape}")
  num_runs, num_sources = w.shape
  if num_runs < 3:
    raise ValueError(f"need at least 3 runs to fit a slope and judge it, got {num_runs}")
  for name, a, ok in (("shares", w, (w > 0) & np.isfinite(w)), ("losses", y, np.isfinite(y))):
    if not ok.all():
      k, s = np.argwhere(~ok)[0]
      raise ValueError(f"{name}[{k}, {s}] = {float(a[k, s])}: must be "
                       + ("finite and > 0" if name == "shares" else "finite"))
  x = np.log(num_sources * w)
  b, c, r2 = (np.empty(num_sources) for _ in range(3))
  for s in range(num_sources):
    if np.ptp(x[:, s]) < 1e-12:
      raise ValueError(f"source {s}'s share is the same in every run ({w[0, s]:.4g}): its "
                       "elasticity is not identified")
    a = np.stack([np.ones(num_runs), x[:, s]], axis=1)
    coef, *_ = np.linalg.lstsq(a, y[:, s], rcond=None)
    resid = y[:, s] - a @ coef
    total = np.sum((y[:, s] - y[:, s].mean()) ** 2)
    c[s], b[s] = coef[0], -coef[1]
    r2[s] = 1 - resid @ resid / total if total > 0 else np.nan
  return ElasticityFit(b=b, intercept=c, r2=r2)


def elasticity_mixture(b: Sequence[float], lam: float = 1.0, floor: float = 0.02,
                       power: float = 1.0) -> np.ndarray:
  """``lam * w / sum w + (1 - lam) / S`` with ``w = max(b, floor) ** power``: the fitted
  mixture (``[S]``).

  ``floor`` (in the units of ``b``) keeps a source of zero or negative fitted elasticity (noise, or
  one already learnt) in the batches. ``power`` sharpens (> 1) or flattens (< 1) the mixture
  around the elasticities' own proportions (1): a run that goes back to uniform after it can
  afford to starve the low-``b`` sources harder than a static mixture can.

  Example: ``elasticity_mixture([0.3, 0.1, -1], lam=1, floor=0.1)`` is ``(0.6, 0.2, 0.2)``; with
  ``power=2`` it is ``(0.09, 0.01, 0.01) / 0.11``.
  """
  b = np.asarray(b, np.float64)
  if b.ndim != 1 or not b.size or not np.isfinite(b).all():
    raise ValueError(f"b must be a non-empty vector of finite numbers, got {b!r}")
  if not 0 <= lam <= 1:
    raise ValueError(f"lam must be in [0, 1], got {lam!r}")
  if not (floor > 0 and math.isfinite(floor)):
    raise ValueError(f"floor must be a finite number > 0, got {floor!r}")
  if not (power > 0 and math.isfinite(power)):
    raise ValueError(f"power must be a finite number > 0, got {power!r}")
  w = np.maximum(b, floor)
  w = (w / w.max()) ** power    # scaled to at most 1 first: no overflow, and the largest stays 1
  return lam * w / w.sum() + (1 - lam) / b.size


def scale_elasticity(num_params: Sequence[float], b_KxS: Sequence[Sequence[float]],
                     target_params: float) -> np.ndarray:
  """Each source's elasticity at a model of ``target_params`` parameters, from fits at ``K >= 2``
  proxy sizes: per source, ``b_s`` as a straight line in ``ln N`` (least squares; through both
  points for two sizes) read at ``ln target_params`` (``[S]``; between the sizes an interpolation,
  beyond them an extrapolation, which amplifies the fits' noise).

  Args:
    num_params: ``[K]`` the proxies' parameter counts, distinct and > 0.
    b_KxS: each proxy's fitted elasticities (:func:`fit_elasticity`), one row per size.
    target_params: the target model's parameter count (> 0).

  Example: ``scale_elasticity([1e5, 1e6], [[0.1, 0.4], [0.3, 0.2]], 1e7)`` is ``(0.5, 0.0)`` (to
  rounding).
  """
  n_K = np.asarray(num_params, np.float64)
  if n_K.ndim != 1 or n_K.size < 2:
    raise ValueError(f"num_params must list at least 2 proxy sizes, got {n_K.tolist()!r}")
  rows = [np.ravel(np.asarray(row, np.float64)) for row in b_KxS]
  if len(rows) != n_K.size or not rows[0].size or {r.size for r in rows} != {rows[0].size}:
    raise ValueError(f"b_KxS must be [sizes={n_K.size}, sources], got rows of lengths "
                     f"{[r.size for r in rows]}")
  b_KxS = np.stack(rows)
  if not (np.isfinite(n_K) & (n_K > 0)).all():
    raise ValueError(f"num_params must be finite and > 0, got {n_K.tolist()!r}")
  if np.unique(n_K).size != n_K.size:
    raise ValueError(f"num_params must be distinct (a slope needs two sizes), got {n_K.tolist()!r}")
  if not np.isfinite(b_KxS).all():
    k, s = np.argwhere(~np.isfinite(b_KxS))[0]
    raise ValueError(f"b_KxS[{k}, {s}] = {float(b_KxS[k, s])}: must be finite")
  if not (math.isfinite(target_params) and target_params > 0):
    raise ValueError(f"target_params must be finite and > 0, got {target_params!r}")
  lnN_K = np.log(n_K) - np.log(n_K).mean()
  slope_S = lnN_K @ (b_KxS - b_KxS.mean(axis=0)) / (lnN_K @ lnN_K)
  return b_KxS.mean(axis=0) + slope_S * (math.log(target_params) - np.log(n_K).mean())


def proxy_schedule(mixture: Sequence[float], num_steps: int, hold: float = 0.5,
                   sources: Sequence[str] = SOURCES,
                   name: str = "proxy") -> ml_collections.ConfigDict:
  """``curriculum.geometries``: ``mixture`` (source order of ``sources``) held on the full
  simplex for the first ``round(hold * num_steps)`` steps (under any strategy), then the full
  simplex without a mixture of its own (``hold = 1``: the mixture throughout). Under the static
  mixer that second part holds ``curriculum.mixer.mixture``: leave it uniform (the
  default) for "then uniform"; under a mixer, the mixer decides it. ``name`` names the first
  geometry.

  Example: ``set_mixer(c, "static"); c.curriculum.geometries = proxy_schedule(w, 800)``.
  """
  mixture = np.asarray(mixture, np.float64)
  if mixture.shape != (len(sources),):
    raise ValueError(f"mixture must have one weight per source ({len(sources)}), got shape "
                     f"{mixture.shape}")
  if not 0 < hold <= 1:
    raise ValueError(f"hold must be in (0, 1], got {hold!r}")
  switch = round(hold * num_steps)
  if name == "uniform" and switch < num_steps:
    raise ValueError("name 'uniform' is the second geometry's (the uniform part after the hold); "
                     "give the mixture's geometry another name")
  g = ml_collections.ConfigDict()
  g[name] = geometry(name, 0, mixture=dict(zip(sources, mixture.tolist())), sources=sources)
  if switch < num_steps:
    g.uniform = geometry("uniform", switch, sources=sources)
  return g
