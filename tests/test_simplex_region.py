"""Region: validation messages, from_bounds, dim, contains; is_feasible eager, jitted, vmapped."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from andrea_jax.simplex import Region, greedy_vertex, is_feasible, project, sample_uniform
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


def _polish_floors():
  # Floors that float32 cannot hold: 0.7f = 0.69999999 and 0.05f = 0.050000001 (checked below).
  return Region.from_bounds({"hermes3-general": 0.7, "chat": 0.05}, {"dictionary": 0.25},
                            exclude=("repo-docs", "repo-docstrings"))


def test_float32_points_of_the_simplex_functions_are_contained():
  r = _polish_floors()
  assert float(np.float32(0.7)) - 0.7 == pytest.approx(-1.19e-8, rel=1e-2)  # under the floor
  lower, upper = jnp.asarray(r.lower, jnp.float32), jnp.asarray(r.upper, jnp.float32)
  scores_Bx16 = jax.random.normal(jax.random.key(0), (64, 16))
  greedy_Bx16 = greedy_vertex(scores_Bx16, lower, upper)
  # Where hermes3-general does not score highest, the vertex leaves it on its float32 floor.
  assert np.float32(0.7) in np.asarray(greedy_Bx16[:, 0])
  projected_Bx16 = project(3.0 * scores_Bx16, lower, upper)
  sampled_Bx16, _ = sample_uniform(jax.random.key(1), lower, upper, 256)
  for points in (greedy_Bx16, projected_Bx16, sampled_Bx16):
    assert points.dtype == jnp.float32
    assert np.all(r.contains(points))
    assert np.all(r.contains(np.asarray(points)))  # numpy float32 too
  # n = 16 in float32: the tolerance is 4 * 16 * 2^-23 = 7.6e-6 on each bound and on the sum.
  w_16 = np.asarray(greedy_Bx16[0]).copy()
  w_16[0] = np.float32(0.7) - np.float32(1e-3)
  w_16[1] += np.float32(1e-3)  # still sums to 1, but 1e-3 under a floor
  assert not r.contains(w_16)
  off_16 = np.asarray(sampled_Bx16[0]).copy()
  off_16[1] += np.float32(4e-6)
  assert r.contains(off_16)
  off_16[1] += np.float32(1.2e-5)  # the sum is now 1.6e-5 over 1
  assert not r.contains(off_16)
  # An explicit atol wins: the old default rejects the float32 floor.
  assert not np.all(r.contains(greedy_Bx16, atol=1e-9))
  assert r.contains(w_16, atol=2e-3)


def test_float64_points_keep_the_tight_tolerance():
  r = _polish_floors()
  w_16 = r.lower.copy()
  w_16[1] += 1 - w_16.sum()  # on the floors, hermes3-creative takes the rest
  assert r.contains(w_16) and r.contains(w_16.tolist())
  assert not r.contains(w_16 + 1e-8 * (np.arange(16) == 1))  # the sum is 1e-8 over 1
  below_16 = w_16 + 1e-8 * ((np.arange(16) == 1).astype(float) - (np.arange(16) == 0))
  assert not r.contains(below_16)  # 1e-8 under the floor of 0.7
  # A float32 point cast to float64 is judged as float64: 0.7f is 1.2e-8 under the floor.
  w32_16 = w_16.astype(np.float32)
  assert r.contains(w32_16) and not r.contains(w32_16.astype(np.float64))
  with jax.enable_x64(True):
    x_16 = jax.random.normal(jax.random.key(0), (16,), jnp.float64)
    w_16 = project(x_16, jnp.asarray(r.lower), jnp.asarray(r.upper))
    assert w_16.dtype == jnp.float64 and r.contains(w_16)
    assert not r.contains(w_16 + 1e-8 * (jnp.arange(16) == 1))


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


def test_half_precision_points_are_judged_as_float32():
  """float16's eps is 2^-10: 4 n eps = 0.0625 at n = 16 would pass a point 0.04 under the 0.7
  floor. Half-precision input gets float32's tolerance, 64 * 2^-23 = 7.6e-6."""
  r = _polish_floors()
  w_16 = r.lower.copy()
  w_16[1] += 1 - w_16.sum()
  off_16 = w_16 + 0.04 * ((np.arange(16) == 1).astype(float) - (np.arange(16) == 0))
  for dtype in (jnp.float16, jnp.bfloat16):
    assert not r.contains(jnp.asarray(off_16, dtype)), dtype     # 0.66 < 0.7
    assert r.contains(jnp.asarray(off_16, dtype), atol=0.1), dtype   # loosened knowingly


def test_is_feasible_allows_the_rounding_of_its_dtype():
  # Ten floors of 0.1: exactly 1 in exact arithmetic, 1.0000001 summed in float32.
  r = Region.from_bounds({s: 0.1 for s in SOURCES[:10]})
  lower = jnp.asarray(r.lower, jnp.float32)
  assert float(jnp.sum(lower)) > 1   # the rounding this test is about
  assert bool(is_feasible(lower, jnp.asarray(r.upper, jnp.float32)))
  assert bool(jax.jit(is_feasible)(lower, jnp.asarray(r.upper, jnp.float32)))
  # A real excess is still refused, at either default tolerance and at an explicit one.
  assert not bool(is_feasible(lower * 1.001, jnp.asarray(r.upper, jnp.float32)))
  assert not bool(is_feasible(jnp.array([0.5, 0.5 + 1e-6]), jnp.ones(2), atol=0.0))
  with jax.enable_x64(True):
    assert not bool(is_feasible(jnp.array([0.5, 0.5 + 1e-9], jnp.float64), jnp.ones(2)))
