"""Region: validation messages, from_bounds, dim, contains; is_feasible eager, jitted, vmapped."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from andrea_jax.simplex import Region, is_feasible
from andrea_jax.sources import SOURCES, WARMUP_SOURCES


def polish():
  return Region.from_bounds({"hermes3-general": 0.7}, {"dictionary": 0.25},
                            exclude=("repo-docs", "repo-docstrings"), label="v3_polish")


@pytest.mark.parametrize("lower, upper, names, message", [
    ([0.7, 0.5, 0.0], [1, 1, 1], None, r"floors sum to 1\.2 > 1 for region 'x'"),
    ([0.0, 0.0], [0.5, 0.4], ("a", "b"), r"ceilings sum to 0\.9 < 1 for region 'x'"),
    ([0.0, 0.2], [1.0, 0.1], ("chat", "dictionary"),
     r"ceiling of 'dictionary' 0\.1 is under its floor 0\.2 for region 'x'"),
    ([0.0, -0.1], [1.0, 1.0], ("a", "b"), r"floor of 'b' -0\.1 is outside \[0, 1\]"),
    ([0.0, 0.0], [1.5, 1.0], ("a", "b"), r"ceiling of 'a' 1\.5 is outside \[0, 1\]"),
    ([0.0, np.nan], [1.0, 1.0], ("a", "b"), r"floor of 'b' is nan for region 'x'"),
    ([0.0, 0.0], [1.0, np.inf], None, r"ceiling of source 1 is inf for region 'x'"),
    ([0.0, 0.0], [1.0, 1.0, 1.0], None, r"2 floors but 3 ceilings for region 'x'"),
    ([0.0, 0.0], [1.0, 1.0], ("a", "b", "c"), r"3 names but 2 floors for region 'x'"),
    ([[0.0, 0.0]], [[1.0, 1.0]], None, r"must be vectors"),
])
def test_bad_regions_are_rejected_with_the_numbers(lower, upper, names, message):
  with pytest.raises(ValueError, match=message):
    Region(np.array(lower), np.array(upper), names=names, label="x")


@pytest.mark.parametrize("kwargs, message", [
    (dict(floors={"wikipedia": 0.1}), r"unknown sources \['wikipedia'\] in floors"),
    (dict(ceilings={"chat": 0.2, "reddit": 0.1}), r"unknown sources \['reddit'\] in ceilings"),
    (dict(exclude=("repo-docs", "repo")), r"unknown sources \['repo'\] in exclude"),
    (dict(only=("chat", "oops")), r"unknown sources \['oops'\] in only"),
    (dict(floors={"repo-docs": 0.1}, exclude=("repo-docs",)),
     r"floor 0\.1 on excluded source 'repo-docs' for region 'p'"),
    (dict(floors={"dictionary": 0.1}, only=WARMUP_SOURCES),
     r"floor 0\.1 on excluded source 'dictionary'"),
    (dict(ceilings={"chat": 0.5}, exclude=("chat",)), r"ceiling 0\.5 on excluded source 'chat'"),
    (dict(exclude=("chat", "chat")), r"exclude lists a source twice"),
    (dict(floors={"chat": 0.6, "oasst": 0.6}), r"floors sum to 1\.2 > 1 for region 'p'"),
    (dict(only=("chat",), ceilings={"chat": 0.5}), r"ceilings sum to 0\.5 < 1"),
])
def test_from_bounds_errors_name_the_problem(kwargs, message):
  with pytest.raises(ValueError, match=message):
    Region.from_bounds(label="p", **kwargs)
  with pytest.raises(TypeError, match="string 'chat'"):
    Region.from_bounds(exclude="chat")


def test_polish_region_from_bounds():
  r = polish()
  assert r.n == 16 and r.names == SOURCES and r.label == "v3_polish"
  assert r.lower[SOURCES.index("hermes3-general")] == 0.7
  assert r.upper[SOURCES.index("dictionary")] == 0.25
  assert np.flatnonzero(r.excluded).tolist() == [8, 9]
  assert r.lower.sum() == 0.7 and r.upper.sum() == 13.25
  # 14 sources keep some room; one sum constraint: 13 dimensions.
  assert r.dim == 13
  with pytest.raises(ValueError):
    r.lower[0] = 0.0  # read-only


@pytest.mark.parametrize("region, dim", [
    (Region.from_bounds(), 15),  # the full simplex of 16 sources
    (Region.from_bounds(only=WARMUP_SOURCES), 6),  # the v2 warmup sub-simplex
    (Region.from_bounds({"H": 0.5}, {"D": 0.25}, sources=("H", "G", "D")), 2),
    # Floors sum to exactly 1: a single point although no coordinate is pinned.
    (Region(np.array([0.5, 0.25, 0.25]), np.ones(3)), 0),
    # Ceilings sum to exactly 1: the single point w = u.
    (Region(np.zeros(3), np.array([0.5, 0.5, 0.0])), 0),
    # One source pinned at 0.3 (l = u), two free: a segment.
    (Region(np.array([0.3, 0, 0]), np.array([0.3, 1, 1])), 1),
    # Only one source left with any room: a single point.
    (Region(np.array([0.3, 0]), np.array([0.3, 1])), 0),
])
def test_dim(region, dim):
  assert region.dim == dim


def test_contains_and_equality():
  r = Region.from_bounds({"H": 0.5}, {"D": 0.25}, sources=("H", "G", "D"), label="seed")
  assert r.contains([0.6, 0.2, 0.2])
  assert not r.contains([0.4, 0.3, 0.3])  # below H's floor
  assert not r.contains([0.5, 0.1, 0.4])  # above D's ceiling
  assert not r.contains([0.6, 0.2, 0.3])  # sums to 1.1
  assert r.contains([0.5 - 1e-12, 0.25, 0.25 + 1e-12])
  np.testing.assert_array_equal(r.contains(np.array([[1, 0, 0], [0, 1, 0]])), [True, False])
  same = Region.from_bounds({"H": 0.5}, {"D": 0.25}, sources=("H", "G", "D"), label="seed")
  assert r == same and hash(r) == hash(same) and r != polish()


def test_is_feasible(maybe_jit):
  f = maybe_jit(is_feasible)
  assert bool(f(jnp.array([0.5, 0.0, 0.0]), jnp.array([1.0, 1.0, 0.25])))
  assert not bool(f(jnp.array([0.7, 0.4]), jnp.ones(2)))  # floors 1.1
  assert not bool(f(jnp.zeros(3), jnp.array([0.3, 0.3, 0.3])))  # ceilings 0.9
  assert not bool(f(jnp.array([0.2, 0.0]), jnp.array([0.1, 1.0])))  # a ceiling under its floor
  # The curriculum's run-time question: can the polish also exclude hermes3-general? No: its floor
  # 0.7 would sit above a ceiling of 0. Excluding oasst is fine.
  r = polish()
  hermes_out = jnp.asarray(r.upper).at[0].set(0.0)
  oasst_out = jnp.asarray(r.upper).at[5].set(0.0)
  lowers = jnp.stack([jnp.asarray(r.lower)] * 2)
  got = maybe_jit(jax.vmap(is_feasible))(lowers, jnp.stack([hermes_out, oasst_out]))
  np.testing.assert_array_equal(got, [False, True])
  np.testing.assert_array_equal(f(lowers, jnp.stack([hermes_out, oasst_out])), [False, True])
