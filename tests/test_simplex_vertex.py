"""Vertices of {l <= w <= u, sum w = 1}: greedy_vertex against an LP solver; vertices()."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.optimize import linprog

from andrea_jax.simplex import Region, greedy_vertex, vertices


def random_regions(rng, batch, n):
  """Random feasible float64 floors and ceilings with exclusions."""
  upper = np.where(rng.random((batch, n)) < 0.5, rng.uniform(0.05, 1, (batch, n)), 1.0)
  upper = np.where(rng.random((batch, n)) < 0.15, 0.0, upper)
  lower = np.where(rng.random((batch, n)) < 0.4, rng.uniform(0, 1, (batch, n)) * upper, 0.0)
  lower *= np.minimum(1, rng.uniform(0, 1, (batch, 1)) / np.maximum(lower.sum(1, keepdims=True),
                                                                    1e-300))
  short = upper.sum(1) < 1
  upper[short, 0] = 1.0
  return lower, upper


def test_greedy_vertex_matches_linprog_with_ties(maybe_jit):
  rng = np.random.default_rng(0)
  lower, upper = random_regions(rng, 300, 16)
  # Scores on a coarse grid, so that most cases have ties.
  scores = rng.integers(0, 4, (300, 16)).astype(np.float64)
  with jax.enable_x64(True):
    w = np.asarray(maybe_jit(greedy_vertex)(scores, lower, upper))
  assert np.all(w >= lower) and np.all(w <= upper)
  np.testing.assert_allclose(w.sum(-1), 1, atol=1e-12)
  assert np.all(w[upper == 0] == 0)
  for s, l, u, wi in zip(scores, lower, upper, w):
    lp = linprog(-s, A_eq=np.ones((1, 16)), b_eq=[1.0], bounds=list(zip(l, u)), method="highs")
    assert lp.status == 0
    np.testing.assert_allclose(s @ wi, -lp.fun, atol=1e-9)


def test_greedy_vertex_tie_break_by_hand(maybe_jit):
  # Floors (0.1, 0, 0, 0.2), ceilings (0.5, 0.3, 0.3, 1): room 1 - 0.3 = 0.7. Scores (1, 2, 2, 0):
  # sources 1 and 2 tie; source 1 (lower index) fills first to its cap 0.3, then source 2 takes
  # 0.3, then source 0 the last 0.1 (of its 0.4 room). w = (0.2, 0.3, 0.3, 0.2).
  f = maybe_jit(greedy_vertex)
  lower, upper = jnp.array([0.1, 0, 0, 0.2]), jnp.array([0.5, 0.3, 0.3, 1.0])
  np.testing.assert_allclose(f(jnp.array([1., 2, 2, 0]), lower, upper), [0.2, .3, .3, .2],
                             atol=1e-7)
  # Ties where the room runs out inside the tie: caps 0.6 each, room 0.7 -> (0.1+0, 0.6, 0.1, 0.2).
  upper = jnp.array([0.5, 0.6, 0.6, 1.0])
  np.testing.assert_allclose(f(jnp.array([1., 2, 2, 0]), lower, upper), [0.1, .6, .1, .2],
                             atol=1e-7)
  # All scores equal: indices in order, 0 takes its 0.4 room, 1 takes the last 0.3.
  np.testing.assert_allclose(f(jnp.zeros(4), lower, upper), [0.5, .3, 0, .2], atol=1e-7)


def test_greedy_vertex_never_feeds_an_excluded_source(maybe_jit):
  # The excluded source has the best score; the mass goes to the next best within its ceiling.
  r = Region.from_bounds({"hermes3-general": 0.7}, {"dictionary": 0.25},
                         exclude=("repo-docs", "repo-docstrings"))
  scores = jnp.zeros(16).at[8].set(10.0).at[9].set(9.0).at[7].set(5.0).at[3].set(1.0)
  w = maybe_jit(greedy_vertex)(scores, r.lower.astype(np.float32), r.upper.astype(np.float32))
  expected = np.zeros(16)
  expected[0], expected[7], expected[3] = 0.7, 0.25, 0.05
  np.testing.assert_allclose(w, expected, atol=1e-7)


def test_greedy_vertex_batches_over_regions(maybe_jit):
  rng = np.random.default_rng(1)
  lower, upper = random_regions(rng, 6, 5)
  scores = rng.normal(size=(6, 5))
  with jax.enable_x64(True):
    batched = np.asarray(maybe_jit(greedy_vertex)(scores, lower, upper))
    mapped = np.asarray(maybe_jit(jax.vmap(greedy_vertex))(scores, lower, upper))
  for s, l, u, wi, wm in zip(scores, lower, upper, batched, mapped):
    lp = linprog(-s, A_eq=np.ones((1, 5)), b_eq=[1.0], bounds=list(zip(l, u)), method="highs")
    np.testing.assert_allclose(wi, lp.x, atol=1e-9)  # unique optimum for continuous scores
    np.testing.assert_allclose(wm, lp.x, atol=1e-9)


def test_seed_example_has_exactly_four_vertices():
  # The source document: (H, G, D), H >= 0.5, D <= 0.25.
  r = Region.from_bounds({"H": 0.5}, {"D": 0.25}, sources=("H", "G", "D"), label="seed")
  expected = [(1, 0, 0), (0.5, 0.5, 0), (0.5, 0.25, 0.25), (0.75, 0, 0.25)]
  v = r.vertices()
  assert v.shape == (4, 3)
  assert sorted(map(tuple, v.tolist())) == sorted(expected)
  # Deterministic order: descending lexicographic.
  assert [tuple(row) for row in v.tolist()] == sorted(expected, reverse=True)


def brute_force_vertices(lower, upper):
  """Every basic feasible solution: choose n - 1 bound constraints, solve with sum w = 1."""
  n = lower.size
  found = []
  for rows in itertools.combinations(range(2 * n), n - 1):
    a, b = [np.ones(n)], [1.0]
    for r in rows:
      a.append(np.eye(n)[r % n])
      b.append(lower[r % n] if r < n else upper[r % n])
    a = np.array(a)
    if abs(np.linalg.det(a)) < 1e-9:
      continue
    w = np.linalg.solve(a, np.array(b))
    if np.all(w >= lower - 1e-12) and np.all(w <= upper + 1e-12):
      found.append(np.round(w, 9))
  return {tuple(w) for w in found}


def test_vertices_match_brute_force_enumeration():
  rng = np.random.default_rng(2)
  lower, upper = random_regions(rng, 40, 5)
  lower[:5] = 0.0
  upper[:5] = 1.0  # plain simplex: the 5 unit vectors
  for l, u in zip(lower, upper):
    v = vertices(l, u)
    assert len({tuple(np.round(w, 9)) for w in v}) == len(v)  # deduplicated
    assert {tuple(np.round(w, 9)) for w in v} == brute_force_vertices(l, u)
  np.testing.assert_array_equal(vertices(np.zeros(3), np.ones(3)), np.eye(3))


def test_greedy_vertex_is_one_of_the_vertices():
  rng = np.random.default_rng(3)
  lower, upper = random_regions(rng, 30, 6)
  scores = rng.normal(size=(30, 6))
  with jax.enable_x64(True):
    w = np.asarray(greedy_vertex(scores, lower, upper))
  for l, u, wi in zip(lower, upper, w):
    assert np.min(np.abs(vertices(l, u) - wi).max(-1)) < 1e-12


def test_vertices_of_a_single_point_and_of_an_empty_region():
  np.testing.assert_allclose(vertices([0.5, 0.5, 0], [1, 1, 0]), [[0.5, 0.5, 0]])
  assert vertices([0.7, 0.7], [1, 1]).shape == (0, 2)
  with pytest.raises(ValueError, match="k = 21"):
    vertices(np.zeros(21), np.ones(21))


def test_greedy_vertex_never_hides_a_nan_score():
  w = greedy_vertex(jnp.array([0.0, 0, 1, jnp.nan]), jnp.zeros(4), jnp.ones(4))
  assert np.isnan(np.asarray(w)).all()
  # One NaN row in a batch spoils only its own row.
  w = greedy_vertex(jnp.array([[0.0, jnp.nan, 1], [0.0, 2, 1]]), jnp.zeros(3), jnp.ones(3))
  assert np.isnan(np.asarray(w[0])).all()
  np.testing.assert_array_equal(w[1], [0, 1, 0])
