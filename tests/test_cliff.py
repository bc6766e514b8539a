"""The zombie-cliff detector: hand-computed scores, planted cliffs, realistic noise, NaNs."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from andrea_jax import cliff
from andrea_jax.sources import SOURCES, source_index

REPO_DOCS = source_index("repo-docs")


def _simulate(seed, steps, *, cliff_step=None, cliff_share=0.5, cliff_loss=0.13, early_tau=None,
              jump_step=None, nan_prob=0.0):
  """Realistic per-step training losses of a 16-source mixture.

  Per-source loss: floor + amplitude * exp(-t / tau), slowly drifting down, with per-sequence noise
  (std 0.25 / sqrt(sequences of that source)). The mixture changes every 7-42 steps: a Dirichlet
  point, or (a quarter of the phases) a near-vertex camp on one source. 64 sequences of 1024 tokens
  per step, so a source often has 0 tokens (its loss is then NaN). With probability 0.003 a step
  spikes upward (all losses times 1.3-2.5). Options plant a cliff (one source at cliff_loss with
  cliff_share of the batch), a fast early decrease (early_tau) or a sudden 40% fall of every source
  at jump_step.
  """
  rng = np.random.default_rng(seed)
  S = len(SOURCES)
  floor_S = rng.uniform(1.2, 4.0, S)
  amp_S = rng.uniform(3.0, 7.0, S)
  tau = early_tau if early_tau is not None else rng.uniform(300.0, 1500.0)
  t = np.arange(steps)
  level_TxS = (floor_S + amp_S * np.exp(-t / tau)[:, None]) * (1 - 0.05 * t / steps)[:, None]
  if jump_step is not None:
    level_TxS[jump_step:] *= 0.6
  shares_TxS = np.zeros((steps, S))
  i = 0
  while i < steps:
    length = rng.integers(7, 43)
    if rng.random() < 0.25:
      w = np.full(S, 0.02)
      w[rng.integers(S)] = 1 - 0.02 * (S - 1)
    else:
      w = rng.dirichlet(np.ones(S))
    shares_TxS[i:i + length] = w
    i += length
  seqs_TxS = np.stack([rng.multinomial(64, p) for p in shares_TxS])
  if cliff_step is not None:
    w = np.full(S, (1 - cliff_share) / (S - 1))
    w[REPO_DOCS] = cliff_share
    seqs_TxS[cliff_step] = rng.multinomial(64, w)
  tokens_TxS = seqs_TxS * 1024.0
  losses_TxS = level_TxS + rng.normal(size=(steps, S)) * 0.25 / np.sqrt(np.maximum(seqs_TxS, 1))
  spikes_T = rng.random(steps) < 0.003
  losses_TxS[spikes_T] *= rng.uniform(1.3, 2.5, size=(spikes_T.sum(), 1))
  if cliff_step is not None:
    losses_TxS[cliff_step, REPO_DOCS] = cliff_loss
  losses_TxS = np.where(tokens_TxS > 0, losses_TxS, np.nan)
  total_T = np.nansum(losses_TxS * tokens_TxS, axis=1) / tokens_TxS.sum(axis=1)
  if nan_prob:
    losses_TxS[rng.random((steps, S)) < nan_prob] = np.nan
    total_T[rng.random(steps) < nan_prob] = np.nan
  return total_T.astype(np.float32), losses_TxS.astype(np.float32), tokens_TxS.astype(np.float32)


@functools.lru_cache(maxsize=None)
def _runner(cfg):
  def run(loss_T, losses_TxS, tokens_TxS):
    def body(state, xs):
      return cliff.cliff_update(cfg, state, *xs)
    xs = (jnp.arange(loss_T.shape[0]), loss_T, losses_TxS, tokens_TxS)
    return jax.lax.scan(body, cliff.cliff_init(losses_TxS.shape[1], cfg.window), xs)
  return jax.jit(run)


def _flags(event):
  return list(np.nonzero(np.asarray(event.flag))[0])


# ---------------------------------------------------------------- config


def test_config_section_round_trips_and_is_validated():
  assert cliff.CliffConfig.from_config(cliff.cliff_config()) == cliff.CliffConfig()
  bad = {"window": 2, "threshold": 0.0, "min_relative_drop": 1.0, "warmup": -1, "respond": 1,
         "cooldown": -5, "require_source": "yes", "min_source_history": 500, "baseline": "mean"}
  for field, value in bad.items():
    with pytest.raises((ValueError, TypeError), match=f"cliff.{field}.*{value!r}"):
      cliff.CliffConfig(**{field: value})
  with pytest.raises(ValueError, match="unknown cliff config field.*'windw'"):
    cliff.CliffConfig.from_config({"windw": 10})
  with pytest.raises(ValueError, match=r"cliff.min_source_history must be <= 200, got 500 \(at "
                                       r"most cliff.window = 200\)"):
    cliff.CliffConfig(min_source_history=500)
  with pytest.raises(ValueError, match="cliff_init: num_sources must be >= 1, got 0"):
    cliff.cliff_init(0, 10)


# ---------------------------------------------------------------- hand-computed


# Small-window settings shared by the hand-made sequences (one compile each): armed at once, a
# source usable after one entry, a short cooldown, respond on.
_SMALL = cliff.CliffConfig(window=5, warmup=0, cooldown=3, min_source_history=1, respond=True)
_SMALL_TOTAL = cliff.CliffConfig(**{**vars(_SMALL), "baseline": "total"})


@functools.lru_cache(maxsize=None)
def _update(cfg):
  return jax.jit(functools.partial(cliff.cliff_update, cfg))


def _feed(cfg, rows):
  update = _update(cfg)
  state = cliff.cliff_init(len(rows[0][1]), cfg.window)
  events = []
  for step, (loss, losses, tokens) in enumerate(rows):
    state, ev = update(state, step, loss, jnp.asarray(losses), jnp.asarray(tokens))
    events.append(ev)
  return state, events


def test_hand_computed_robust_score_total_baseline():
  cfg = _SMALL_TOTAL
  history = [(2.0, [2.0, 2.0]), (2.1, [2.2, 2.0]), (1.9, [1.8, 2.0]), (2.2, [2.4, 2.0]),
             (1.8, [1.6, 2.0])]
  rows = [(l, s, [100.0, 100.0]) for l, s in history]
  # Step 5: source 0 falls to 0.2, source 1 stays; total 1.1.
  rows.append((1.1, [0.2, 2.0], [100.0, 100.0]))
  state, events = _feed(cfg, rows)
  ev = events[-1]
  # Totals: median 2.0, |dev| = 0 .1 .1 .2 .2 -> MAD 0.1.
  # Source 0: median 2.0, |dev| = 0 .2 .2 .4 .4 -> MAD 0.2.
  # Source 1 is flat at 2.0 (MAD 0): its score is 0 since its loss did not move.
  np.testing.assert_allclose(float(ev.expected), 2.0, rtol=1e-6)
  np.testing.assert_allclose(float(ev.score), 0.9 / (1.4826 * 0.1 + 2e-6), rtol=1e-4)
  assert bool(ev.flag) and int(ev.source) == 0
  np.testing.assert_allclose(float(ev.source_score), 1.8 / (1.4826 * 0.2 + 2e-6), rtol=1e-4)
  np.testing.assert_allclose(float(ev.source_drop), 1.8, rtol=1e-5)
  assert not any(bool(e.flag) for e in events[:-1])
  # The cliff is not in the window.
  assert int(state.count) == 5 and 1.1 not in np.asarray(state.loss_W).round(4).tolist()


def test_mixture_shift_is_not_a_cliff_but_moves_a_total_baseline():
  # Every source's loss is constant (A = 3, B = 1); only the mixture moves, to 90% B at the last
  # step.
  def rows(last_share_b):
    out = []
    for t in range(8):
      pb = 0.5 if t < 7 else last_share_b
      out.append((3.0 * (1 - pb) + 1.0 * pb, [3.0, 1.0], [1000.0 * (1 - pb), 1000.0 * pb]))
    return out

  _, ev = _feed(_SMALL, rows(0.9))
  np.testing.assert_allclose(float(ev[-1].expected), 0.1 * 3.0 + 0.9 * 1.0, rtol=1e-6)
  assert abs(float(ev[-1].score)) < 1.0  # 0 up to float32 rounding of the shares
  assert not bool(ev[-1].flag)
  # The median of past totals (2.0) calls 1.2 a 40% fall; no source fell, so require_source holds
  # it.
  _, ev = _feed(_SMALL_TOTAL, rows(0.9))
  assert float(ev[-1].score) > 6 and not bool(ev[-1].flag) and int(ev[-1].source) == -1
  _, ev = _feed(cliff.CliffConfig(**{**vars(_SMALL_TOTAL), "require_source": False}), rows(0.9))
  assert bool(ev[-1].flag) and int(ev[-1].source) == -1


# ---------------------------------------------------------------- realistic curves


# The default settings except a shorter warmup, to keep the runs short (the warmup has its own
# test).
_SHORT = cliff.CliffConfig(warmup=500)
_T = 2500  # steps of every realistic run (one compiled scan)


@pytest.mark.slow
def test_planted_cliff_is_caught_and_attributed_to_repo_docs():
  # repo-docs takes 30%, 50% or 95% of one step's batch and its loss falls to 0.13 (the seed's
  # value).
  for seed, share in [(0, 0.3), (1, 0.5), (2, 0.95)]:
    state, ev = _runner(_SHORT)(*_simulate(seed, _T, cliff_step=2200, cliff_share=share))
    assert _flags(ev) == [2200], (seed, _flags(ev))
    assert int(ev.source[2200]) == REPO_DOCS
    assert float(ev.source_drop[2200]) > 0.5
    assert "repo-docs" in cliff.describe_event(jax.tree.map(lambda x: x[2200], ev), SOURCES)
    # Without respond, nothing is marked for exclusion.
    assert not bool(ev.exclude[2200]) and not np.any(np.asarray(state.excluded_S))


def test_realistic_training_noise_is_never_flagged():
  for seed in range(10, 13):
    _, ev = _runner(_SHORT)(*_simulate(seed, _T))
    assert _flags(ev) == [], seed
    assert float(jnp.max(ev.score[700:])) < 6.0


def test_fast_early_decrease_is_held_by_the_warmup():
  # A fast decay, and every source falling by 40% at step 300: a sudden early phase of learning.
  data = _simulate(20, _T, early_tau=150.0, jump_step=300)
  _, ev = _runner(_SHORT)(*data)
  assert _flags(ev) == []
  # At the fall, the step passes a hair-trigger threshold of 2 and the relative drop: only the
  # warmup (step 300 < 500) holds it there (attribution only runs on armed candidates).
  assert float(ev.score[300]) > 2.0
  assert float(ev.loss[300]) < (1 - _SHORT.min_relative_drop) * float(ev.expected[300])
  assert int(ev.source[300]) == -1


def test_small_dip_in_a_quiet_window_is_held_by_min_relative_drop():
  rng = np.random.default_rng(3)
  losses_TxS = (2.0 + 0.001 * rng.normal(size=(_T, 16))).astype(np.float32)
  losses_TxS[2200] *= 0.95  # a 5% dip: dozens of robust sd in this quiet window, but no cliff
  tokens_TxS = np.full((_T, 16), 500.0, np.float32)
  loss_T = losses_TxS.mean(axis=1)
  _, ev = _runner(_SHORT)(loss_T, losses_TxS, tokens_TxS)
  assert _flags(ev) == []
  # Armed, far past the threshold: only the relative drop (5% < 15%) holds it.
  assert float(ev.score[2200]) > 20 and float(ev.loss[2200]) > 0.85 * float(ev.expected[2200])


def test_nan_and_missing_entries_do_not_break_detection():
  loss_T, losses_TxS, tokens_TxS = _simulate(4, _T, cliff_step=2200, nan_prob=0.02)
  loss_T[2200] = np.nansum(losses_TxS[2200] * tokens_TxS[2200]) / tokens_TxS[2200].sum()
  losses_TxS[2200, REPO_DOCS] = 0.13
  losses_TxS[:, 0] = np.where(tokens_TxS[:, 0] > 0, losses_TxS[:, 0], 1e9)  # garbage where 0 tokens
  state, ev = _runner(_SHORT)(loss_T, losses_TxS, tokens_TxS)
  assert _flags(ev) == [2200] and int(ev.source[2200]) == REPO_DOCS
  assert np.isnan(loss_T).sum() > 10
  for name, leaf in vars(ev).items():
    if name != "loss":  # the loss as given, NaN where it was NaN
      assert np.all(np.isfinite(np.asarray(leaf, np.float64))), name
  assert np.nanmax(np.asarray(state.loss_WxS)[:, 0]) < 1e3


def test_nan_loss_leaves_the_state_unchanged_and_raises_nothing(maybe_jit):
  eager = functools.partial(cliff.cliff_update, _SMALL)
  update = _update(_SMALL) if maybe_jit is jax.jit else eager
  state = cliff.cliff_init(2, _SMALL.window)
  state, _ = update(state, 0, 2.0, jnp.array([2.0, 2.0]), jnp.array([1.0, 1.0]))
  new, ev = update(state, 1, jnp.nan, jnp.array([jnp.nan, jnp.inf]), jnp.array([1.0, 1.0]))
  for a, b in zip(jax.tree.leaves(state), jax.tree.leaves(new)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  assert not bool(ev.flag) and float(ev.score) == 0.0 and int(ev.source) == -1
  # Missing per-source entries (no tokens, or a non-finite loss) are stored as missing.
  new, _ = update(state, 2, 2.0, jnp.array([5.0, 2.0]), jnp.array([0.0, 3.0]))
  np.testing.assert_array_equal(np.asarray(new.loss_WxS[1]), [np.nan, 2.0])
  np.testing.assert_array_equal(np.asarray(new.tokens_WxS[1]), [0.0, 3.0])
  new, _ = update(state, 2, 2.0, jnp.array([2.0, jnp.nan]), jnp.array([4.0, 3.0]))
  np.testing.assert_array_equal(np.asarray(new.loss_WxS[1]), [2.0, np.nan])
  np.testing.assert_array_equal(np.asarray(new.tokens_WxS[1]), [4.0, 0.0])


def test_persisting_cliff_cooldown_and_response():
  steady = [(2.0 + 0.01 * (t % 3), [2.0 + 0.01 * (t % 3)] * 2, [10.0, 10.0]) for t in range(10)]
  cliffs = [(1.0, [0.01, 2.0], [10.0, 10.0])] * 8
  state, events = _feed(_SMALL, steady + cliffs)
  flags = [t for t, e in enumerate(events) if bool(e.flag)]
  assert flags == [10, 13, 16]  # one per cooldown period while the ravine persists
  assert int(state.num_flags) == 3 and int(state.last_flag_step) == 16
  assert int(state.count) == 5 and float(jnp.min(state.loss_W)) >= 2.0  # cliffs never entered
  assert np.asarray(state.excluded_S).tolist() == [True, False] and bool(events[10].exclude)


def test_sorted_windows_stay_the_sorted_ring_buffers():
  # Many evictions, missing entries, NaN steps and rejected cliffs: the sorted copies that give the
  # medians must always equal a fresh sort of the ring buffers (NaN last).
  loss_T, losses_TxS, tokens_TxS = _simulate(5, _T, cliff_step=2200, nan_prob=0.05)
  state, ev = _runner(_SHORT)(loss_T, losses_TxS, tokens_TxS)
  np.testing.assert_array_equal(np.asarray(state.sorted_loss_W), np.sort(np.asarray(state.loss_W)))
  np.testing.assert_array_equal(np.asarray(state.sorted_x_W), np.sort(np.asarray(state.x_W)))
  np.testing.assert_array_equal(np.asarray(state.sorted_loss_WxS),
                                np.sort(np.asarray(state.loss_WxS), axis=0))
  assert int(state.count) == _SHORT.window and _flags(ev) == [2200]


def test_fresh_state_owns_one_buffer_per_field_and_can_be_donated():
  # The trainer donates the state; XLA refuses a buffer donated twice, so no two fields may share
  # one. Built un-jitted, as a user calls it.
  state = cliff.cliff_init(2, _SMALL_TOTAL.window)
  leaves = jax.tree.leaves(state)
  assert len({x.unsafe_buffer_pointer() for x in leaves}) == len(leaves)
  update = jax.jit(functools.partial(cliff.cliff_update, _SMALL_TOTAL), donate_argnums=0)
  state, ev = update(state, 0, jnp.float32(2.5), jnp.array([2.0, 3.0]), jnp.array([50.0, 50.0]))
  # One accepted step: it fills slot 0 of every buffer and leads each sorted column.
  nan = float("nan")
  np.testing.assert_array_equal(np.asarray(state.loss_W), [2.5, nan, nan, nan, nan])
  np.testing.assert_array_equal(np.asarray(state.sorted_loss_W), [2.5, nan, nan, nan, nan])
  np.testing.assert_array_equal(np.asarray(state.x_W), [2.5, nan, nan, nan, nan])  # x = loss
  np.testing.assert_array_equal(np.asarray(state.sorted_loss_WxS), [[2.0, 3.0]] + [[nan, nan]] * 4)
  assert int(state.count) == 1 and int(state.pos) == 1 and not bool(ev.flag)
