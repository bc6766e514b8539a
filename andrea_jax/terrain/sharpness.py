"""Perturbation sharpness: how much the loss rises under random weight perturbations of a size.

A wide basin (many nearby weights with low loss; the PAC-Bayes reading of generalisation) shows a
small rise, a narrow one a large rise. The perturbation is ``sigma * d`` with ``d`` a
filter-normalised random direction (:func:`andrea_jax.terrain.directions.random_direction`), so
``sigma`` is a size relative to the weights themselves: ``sigma = 0.1`` moves every filter by 10% of
its norm.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from andrea_jax import checks
from andrea_jax.terrain.directions import perturb, random_direction

PyTree = Any


class Sharpness(NamedTuple):
  """Result of :func:`perturbation_sharpness` (all arrays; ``K`` sizes, ``N`` samples)."""
  sigmas: jax.Array  # [K] relative perturbation sizes
  base_loss: jax.Array  # [] L(w)
  increase_KxN: jax.Array  # L(w + sigma_k d_n) - L(w)
  mean: jax.Array  # [K] mean over n of increase_KxN
  std: jax.Array  # [K] sample standard deviation (ddof=1; 0 when N == 1)


def _check(sigmas: Any, num_samples: int, batch_size: int | None) -> None:
  checks.integer("num_samples", num_samples, minimum=1)
  shape = jnp.shape(jnp.asarray(sigmas))
  if len(shape) != 1 or shape[0] == 0:
    raise ValueError(f"sigmas must be a non-empty 1-D sequence, got shape {shape}")
  _check_batch_size(batch_size)


def _check_batch_size(batch_size: int | None) -> None:
  checks.integer("batch_size", batch_size, minimum=1, optional=True)


def perturbed_losses(loss_fn: Callable[[PyTree], jax.Array], params: PyTree, key: jax.Array,
                     sigmas: Sequence[float] | jax.Array, samples: Sequence[int] | jax.Array, *,
                     filter_norm: bool = True, ignore_1d: bool = True,
                     batch_size: int | None = None) -> jax.Array:
  """``loss_NxK[i, k] = L(w + sigma_k d_{n_i})`` for the sample indices ``n_i`` of ``samples``.

  ``d_n = random_direction(jax.random.fold_in(key, n), params, ...)``: sample ``n`` is the same
  direction whichever other samples are asked for, so the samples of
  :func:`perturbation_sharpness` can be computed a chunk at a time (``samples = [8, 9, ..., 15]``)
  and agree with one call over all of them.

  Memory: ``batch_size=None`` vmaps over all ``N`` samples (``N`` directions, ``N`` perturbed
  copies of the weights and ``N`` forward passes in flight); an int ``b`` evaluates ``b`` samples
  at a time with ``jax.lax.map``. The sizes of one sample are evaluated one after the other.

  Args:
    loss_fn, params, key, sigmas, filter_norm, ignore_1d: as in :func:`perturbation_sharpness`.
    samples: ``[N]`` sample indices (ints).
    batch_size: samples evaluated together (``None``: all).

  Returns:
    ``[N, K]`` losses.

  Example:
    >>> perturbed_losses(loss_fn, params, jax.random.key(0), [0.01, 0.1], jnp.arange(4, 8))  # [4, 2]
  """
  _check_batch_size(batch_size)
  sigmas_K = jnp.asarray(sigmas)
  samples_N = jnp.asarray(samples)

  def losses_for(n: jax.Array) -> jax.Array:  # -> [K]
    d = random_direction(jax.random.fold_in(key, n), params, filter_norm=filter_norm,
                         ignore_1d=ignore_1d)
    return jax.lax.map(lambda s: loss_fn(perturb(params, d, s)), sigmas_K)

  if batch_size is None:
    return jax.vmap(losses_for)(samples_N)
  return jax.lax.map(losses_for, samples_N, batch_size=batch_size)


def perturbation_sharpness(loss_fn: Callable[[PyTree], jax.Array], params: PyTree, key: jax.Array,
                           sigmas: Sequence[float] | jax.Array, num_samples: int, *,
                           filter_norm: bool = True, ignore_1d: bool = True,
                           batch_size: int | None = None) -> Sharpness:
  """Mean and spread of the loss increase ``L(w + sigma d) - L(w)`` over random directions ``d``.

  Sample ``n`` uses the direction ``random_direction(jax.random.fold_in(key, n), params, ...)``; the
  same ``N`` directions serve every ``sigma`` (common random numbers, so the curve over ``sigma`` is
  smooth). Without filter normalisation and for a quadratic ``L(w) = w^T A w / 2`` in ``R^n`` the
  expectation is ``sigma^2 ||w||^2 trace(A) / (2 n)``; in general, for small ``sigma``, it is
  ``sigma^2 / 2`` times the curvature averaged over the direction distribution.

  Memory: as :func:`perturbed_losses` (``batch_size=None``: all ``N`` samples at once; an int
  ``b``: ``b`` at a time). Traceable: wrap the call in ``jax.jit`` (with ``loss_fn``,
  ``num_samples`` and the flags bound) for speed.

  Args:
    loss_fn: ``params -> scalar`` loss (close over the batch).
    params: the weights ``w``.
    key: PRNG key for the directions.
    sigmas: ``[K]`` relative perturbation sizes.
    num_samples: ``N`` random directions.
    filter_norm: per-filter normalisation (Li et al.); else the direction has global norm ``||w||``.
    ignore_1d: no perturbation of biases and norm scales.
    batch_size: samples evaluated together (``None``: all).

  Returns:
    :class:`Sharpness` with ``mean``/``std`` of shape ``[K]``.

  Example:
    >>> s = perturbation_sharpness(loss_fn, params, jax.random.key(0), [0.01, 0.05, 0.1], 8)
    >>> s.mean  # [3], grows like sigma^2 near a minimum; smaller = wider basin
  """
  _check(sigmas, num_samples, batch_size)
  base_loss = loss_fn(params)
  loss_NxK = perturbed_losses(loss_fn, params, key, sigmas, jnp.arange(num_samples),
                              filter_norm=filter_norm, ignore_1d=ignore_1d, batch_size=batch_size)
  sigmas_K = jnp.asarray(sigmas)
  increase_KxN = loss_NxK.T - base_loss
  mean_K = jnp.mean(increase_KxN, axis=1)
  if num_samples > 1:
    std_K = jnp.std(increase_KxN, axis=1, ddof=1)
  else:
    std_K = jnp.zeros_like(mean_K)
  return Sharpness(sigmas_K, base_loss, increase_KxN, mean_K, std_K)
