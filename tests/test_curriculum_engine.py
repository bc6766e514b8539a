"""The curriculum engine through the trainer's interface: schedule and decision lag, exclusions,
pivots, metrics. One jitted ``update`` (the spec is a pytree argument) serves every test here."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from andrea_jax import curriculum
from andrea_jax.sources import SOURCES, WARMUP_SOURCES

# The tiny default: v2 warmup at 0, firehose at 200, polish at 1126 (all specs here share its tree).
POLISH = 1126
_update = jax.jit(curriculum.update)
_exclude = jax.jit(curriculum.exclude)
_metrics = jax.jit(curriculum.metrics)


def _spec(**fields):
  c = curriculum.curriculum_config()
  for k, v in fields.items():
    if k.startswith("mixer_"):
      c.mixer[k[len("mixer_"):]] = v
    else:
      c[k] = v
  return curriculum.spec_from_config(c)


def _losses(step, w_S):
  """Each source's loss falls with the tokens it got; a deterministic stand-in for the trainer."""
  tokens_S = np.floor(w_S * 4096)
  losses_S = np.where(tokens_S > 0, 5.0 - 1e-4 * step * (1 + np.arange(len(w_S)) % 3), np.nan)
  return jnp.asarray(losses_S, jnp.float32), jnp.asarray(tokens_S, jnp.float32)


def _run(spec, num_steps, *, key=0, actions=None):
  """Drives the curriculum as the trainer does; returns (weights used [N, S], snapshots, states)."""
  state = curriculum.init(spec, jax.random.key(key))
  snapshots = {-1: jax.tree.map(np.asarray, curriculum.schedule(state))}
  used, states = [], {}
  for t in range(num_steps):
    # The host reads the schedule recorded after update(t - 1 - lag), as the trainer's feed does.
    w_S = curriculum.weights_at(snapshots[max(t - 1 - spec.decision_lag, -1)], t)
    used.append(w_S)
    state = _update(spec, state, t, *_losses(t, w_S))
    if actions and t in actions:
      state = actions[t](state)
    snapshots[t] = jax.tree.map(np.asarray, curriculum.schedule(state))
    states[t] = state
  return np.stack(used), snapshots, states


@pytest.fixture(scope="module")
def andrea_run():
  spec = _spec()
  return (spec,) + _run(spec, 1300)


def test_weights_at_host_lookup():
  sched = curriculum.Schedule(np.array([[1.0, 0.0], [0.25, 0.75]]), np.array([10, 30], np.int32))
  np.testing.assert_array_equal(curriculum.weights_at(sched, 10), [1.0, 0.0])
  np.testing.assert_array_equal(curriculum.weights_at(sched, 29), [1.0, 0.0])
  np.testing.assert_array_equal(curriculum.weights_at(sched, 31), [0.25, 0.75])
  np.testing.assert_array_equal(curriculum.weights_at(sched, np.array([12, 30])),
                                [[1.0, 0.0], [0.25, 0.75]])
  with pytest.raises(ValueError, match="step 9 is before the schedule's first phase"):
    curriculum.weights_at(sched, 9)
  np.testing.assert_array_equal(curriculum.lookup(sched, jnp.int32(30)), [0.25, 0.75])


def test_init_covers_the_first_steps():
  spec = _spec()
  state = curriculum.init(spec, jax.random.key(3))
  warm = np.array([s in WARMUP_SOURCES for s in SOURCES])
  for t in range(spec.decision_lag + 2):
    # Projection of the uniform mixture onto the warmup sub-simplex: 1/7 on each warmup source.
    np.testing.assert_allclose(curriculum.weights_at(curriculum.schedule(state), t),
                               np.where(warm, 1 / 7, 0.0), rtol=1e-6)
  assert spec.phase_min_steps <= int(state.next_start) <= spec.phase_max_steps
  assert int(state.step) == -1


def test_every_valid_snapshot_gives_the_same_weights(andrea_run):
  spec, used, snapshots, _ = andrea_run
  lag = spec.decision_lag
  for t in range(len(used)):
    # Valid for step t: the snapshots read after update(t - 1 - lag) .. update(t).
    for t_read in range(max(t - 1 - lag, -1), t + 1):
      np.testing.assert_array_equal(curriculum.weights_at(snapshots[t_read], t), used[t],
                                    err_msg=f"step {t} from the schedule read after {t_read}")


def test_regions_hold_from_each_pivot_on(andrea_run):
  _, used, _, _ = andrea_run
  warm = np.array([s in WARMUP_SOURCES for s in SOURCES])
  assert np.all(used[:200][:, ~warm] == 0) and np.all(used[:200][:, warm].sum(1) > 0.999)
  assert np.any(used[200:POLISH][:, ~warm] > 0)
  polish = used[POLISH:]
  assert np.all(polish[:, SOURCES.index("repo-docs")] == 0)
  assert np.all(polish[:, SOURCES.index("repo-docstrings")] == 0)
  assert np.all(polish[:, SOURCES.index("hermes3-general")] >= np.float32(0.7))
  assert np.all(polish[:, SOURCES.index("dictionary")] <= np.float32(0.25))
  assert np.all(used >= 0) and np.all(np.abs(used.sum(1) - 1) <= 1e-6)


def test_metrics_describe_the_current_phase(andrea_run):
  spec, used, _, states = andrea_run
  for t in (0, 199, 200, 700, POLISH, 1299):
    m = _metrics(spec, states[t])
    assert int(m["geometry"]) == np.searchsorted(spec.starts, t, side="right") - 1
    assert int(m["phase_start"]) <= t < int(m["next_decision"]) + spec.decision_lag + 1
    assert spec.labels[int(m["phase_label"])] in ("random", "bandit", "start")
    np.testing.assert_array_equal(m["weights"], used[t])
    for k in ("ucb", "bandit_mean", "bandit_count", "reward", "progress"):
      assert m[k].shape == (16,) and np.all(np.isfinite(m[k])), k
  assert int(_metrics(spec, states[1299])["phase"]) > 1300 // 42


def test_exclusion_applies_from_the_next_undecided_phase():
  spec = _spec()
  chat = SOURCES.index("chat")
  mask = jnp.asarray(np.arange(16) == chat)
  at = {}

  def exclude_chat(state):
    at["next_start"] = int(state.next_start)
    return _exclude(spec, state, mask)

  used, _, states = _run(spec, 400, actions={100: exclude_chat})
  start = at["next_start"]
  assert used[100:start, chat].min() > 0      # already decided: kept
  assert np.all(used[start:, chat] == 0)      # from the next phase on, also after the pivot at 200
  assert bool(states[399].excluded[chat]) and not np.any(states[399].rejected)
  assert np.all(np.abs(used.sum(1) - 1) <= 1e-6)


def test_infeasible_exclusions_are_ignored_and_reported():
  spec = _spec()
  hermes = SOURCES.index("hermes3-general")
  warm_mask = jnp.asarray([s in WARMUP_SOURCES for s in SOURCES])
  state = curriculum.init(spec, jax.random.key(0))
  # Excluding all seven warmup sources during the warmup would leave nothing: refused whole.
  refused = _exclude(spec, state, warm_mask)
  assert not np.any(refused.excluded)
  np.testing.assert_array_equal(refused.rejected, warm_mask)

  # Excluding hermes3-general in the firehose is fine, but the polish floors it at 0.7: from the
  # pivot on the polish bounds hold, without the extra exclusion, which is reported.
  def exclude_hermes(state):
    return _exclude(spec, state, jnp.asarray(np.arange(16) == hermes))

  used, _, states = _run(spec, 1300, actions={300: exclude_hermes})
  assert np.all(used[400:POLISH, hermes] == 0)
  assert np.all(used[POLISH:, hermes] >= np.float32(0.7))
  assert bool(states[1299].rejected[hermes])


def test_one_exclusion_a_geometry_cannot_take_does_not_cancel_the_others():
  # chat excluded, then hermes3-general: the polish region can drop chat but floors hermes3-general
  # at 0.7. From the pivot on, chat stays out and only hermes3-general is refused.
  spec = _spec()
  chat, hermes = SOURCES.index("chat"), SOURCES.index("hermes3-general")
  one = lambda i: (lambda state: _exclude(spec, state, jnp.asarray(np.arange(16) == i)))
  used, _, states = _run(spec, 1300, actions={300: one(chat), 350: one(hermes)})
  assert np.all(used[450:POLISH, [chat, hermes]] == 0)
  assert np.all(used[POLISH:, chat] == 0)
  assert np.all(used[POLISH:, hermes] >= np.float32(0.7))
  np.testing.assert_array_equal(np.flatnonzero(states[1299].rejected), [hermes])
  np.testing.assert_allclose(used.sum(1), 1, atol=1e-6)


def test_an_earlier_exclusion_a_geometry_cannot_take_does_not_block_a_new_one():
  # hermes3-general excluded in the firehose (the polish floors it at 0.7, so it comes back), then
  # dictionary during the polish: feasible on its own, applied; only hermes3-general is refused.
  # The second request holds both, as the trainer sends it (every source the cliff detector has
  # flagged so far).
  spec = _spec()
  hermes, dictionary = SOURCES.index("hermes3-general"), SOURCES.index("dictionary")
  some = lambda *i: (lambda state: _exclude(spec, state, jnp.asarray(np.isin(np.arange(16), i))))
  used, _, states = _run(spec, 1300, actions={300: some(hermes), 1200: some(hermes, dictionary)})
  assert used[POLISH:, hermes].min() >= np.float32(0.7)
  last = int(np.flatnonzero(used[1200:, dictionary] > 0).max()) + 1200 if np.any(
      used[1200:, dictionary] > 0) else 1200
  assert last < 1200 + 42 + spec.decision_lag + 1       # out from the next undecided phase on
  assert np.all(used[last + 1:, dictionary] == 0) and last + 1 < 1300
  assert bool(states[1299].excluded[dictionary])
  np.testing.assert_array_equal(np.flatnonzero(states[1299].rejected), [hermes])
  # A request the region cannot take is still refused whole (the seven warmup sources at once).
  state = curriculum.init(spec, jax.random.key(0))
  warm = jnp.asarray([s in WARMUP_SOURCES for s in SOURCES])
  assert not np.any(_exclude(spec, state, warm).excluded)


def test_wrong_shapes_are_refused_naming_the_shape():
  spec = _spec()
  state = curriculum.init(spec, jax.random.key(0))
  for mask in (np.array([3]), True, np.ones(15, bool)):
    with pytest.raises(ValueError, match=r"exclude: mask must be a \[S\] = \(16,\) bool mask"):
      curriculum.exclude(spec, state, mask)
  with pytest.raises(ValueError, match=r"update: losses must be \[S\] = \(16,\), one per source, "
                                      r"got shape \(1,\)"):
    curriculum.update(spec, state, 0, jnp.ones(1), jnp.ones(16))
  with pytest.raises(ValueError, match=r"update: tokens must be \[S\]"):
    curriculum.update(spec, state, 0, jnp.ones(16), jnp.ones(15))


@pytest.mark.slow
def test_pivot_discounts_the_bandit():
  runs = {d: _run(_spec(mixer_pivot_discount=d), 240)[2] for d in (1.0, 0.25, 0.0)}
  # The decision of the first firehose phase is the one after which slot 1 holds geometry 1.
  pivot_t = next(t for t in range(1, 240) if int(runs[1.0][t].geometries[1]) == 1
                 and int(runs[1.0][t - 1].geometries[1]) == 0)
  counts = {d: np.asarray(r[pivot_t].mixer[0].counts) for d, r in runs.items()}
  assert np.any(counts[1.0] > 0)
  np.testing.assert_array_equal(counts[0.25], 0.25 * counts[1.0])  # same path until then
  np.testing.assert_array_equal(counts[0.0], 0.0)                  # 0 resets
  np.testing.assert_array_equal(runs[0.25][pivot_t - 1].mixer[0].counts,
                                runs[1.0][pivot_t - 1].mixer[0].counts)


def test_state_is_a_plain_pytree_for_checkpoints(andrea_run):
  spec, _, _, states = andrea_run
  state = states[500]
  restored = jax.tree.map(jnp.asarray, jax.tree.map(np.asarray, state))
  a = _update(spec, state, 501, *_losses(501, np.full(16, 1 / 16)))
  b = _update(spec, restored, 501, *_losses(501, np.full(16, 1 / 16)))
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    np.testing.assert_array_equal(x, y)
  assert all(isinstance(x, jax.Array) for x in jax.tree.leaves(state))


def test_fresh_state_can_be_donated():
  # The trainer donates its state: no two leaves may share a buffer.
  state = curriculum.init(_spec(), jax.random.key(0))
  pointers = [x.unsafe_buffer_pointer() for x in jax.tree.leaves(state)]
  assert len(set(pointers)) == len(pointers)
  jax.block_until_ready(jax.jit(lambda s: s, donate_argnums=0)(state))


def test_float32_state_under_x64():
  # Tracing is enough to check every branch's dtypes (lax.cond and lax.switch trace them all).
  with jax.enable_x64(True):
    spec = _spec()
    state = jax.eval_shape(curriculum.init, spec, jax.random.key(0))
    new = jax.eval_shape(curriculum.update, spec, state, 5, jnp.ones(16), jnp.ones(16))
    metrics = jax.eval_shape(curriculum.metrics, spec, new)
  assert jax.tree.map(lambda x: x.dtype, new) == jax.tree.map(lambda x: x.dtype, state)
  assert {x.dtype for x in jax.tree.leaves(new)} <= {
      np.dtype(np.float32), np.dtype(np.int32), np.dtype(np.uint32), np.dtype(bool)}
  assert {x.dtype for x in jax.tree.leaves(metrics)} <= {np.dtype(np.float32), np.dtype(np.int32)}
