"""Mixture sampler: exact allocation, stateless batches, process slices, packing vs a slow loop."""

import json

import hypothesis
import hypothesis.strategies as st
import numpy as np
import pytest

from andrea_jax.data import (DataError, MixtureSampler, PreparedData, SourceSpec, allocate,
                             eval_batches, load_tokenizer, prepare, realised_shares)
from andrea_jax.sources import SOURCES

SEQ = 32
EOD = 256


@pytest.fixture(scope="module")
def data(tmp_path_factory):
  """16 sources of random lowercase text (a different letter range per source), small shards."""
  root = tmp_path_factory.mktemp("sampler")
  rng = np.random.default_rng(0)
  specs = {}
  for i, s in enumerate(SOURCES):
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))[i % 10:i % 10 + 12]
    docs = ["".join(rng.choice(letters, rng.integers(20, 400))) for _ in range(60)]
    path = root / f"{s}.jsonl"
    path.write_text("\n".join(json.dumps({"text": d}) for d in docs) + "\n")
    specs[s] = SourceSpec(paths=(str(path),), eval_fraction=0.2)
  out = str(root / "prepared")
  prepare(specs, load_tokenizer("bytes"), out, shard_tokens=3000, progress=False)
  return PreparedData.open(out, tokenizer=load_tokenizer("bytes"))


def _stream(data, source, split="train"):
  return np.concatenate([np.asarray(m) for m in data.shards(source, split)]).astype(np.uint16)


def _find(stream, window):
  """Offsets where ``window`` occurs in ``stream`` (byte search, aligned to tokens)."""
  hay, needle = stream.tobytes(), np.asarray(window, np.uint16).tobytes()
  hits, at = [], hay.find(needle)
  while at >= 0:
    if at % 2 == 0:
      hits.append(at // 2)
    at = hay.find(needle, at + 1)
  return hits


def _one_hot(*pairs):
  w = np.zeros(len(SOURCES))
  for i, v in pairs:
    w[i] = v
  return w


# --- allocate -----------------------------------------------------------------------------------

def test_allocate_worked_examples():
  # 24 * (1/2, 1/4, 1/8, 1/8) = 12, 6, 3, 3 exactly.
  assert allocate(np.array([0.5, 0.25, 0.125, 0.125]), 24).tolist() == [12, 6, 3, 3]
  # 10 / 3 = 3.33 each: floors 3, 3, 3 and the one remaining row goes to the lowest index.
  assert allocate(np.full(3, 1 / 3), 10).tolist() == [4, 3, 3]
  # quotas 0.7, 2.1, 0.2 -> floors 0, 2, 0, remainder 1 to the largest fraction (0.7, index 0).
  assert allocate(np.array([0.7, 2.1, 0.2]) / 3, 3).tolist() == [1, 2, 0]
  # zero weights get zero rows even when the remainder is large.
  assert allocate(np.array([0.0, 1 / 3, 0.0, 2 / 3, 0.0]), 2).tolist() == [0, 1, 0, 1, 0]


@hypothesis.given(st.lists(st.integers(0, 1000), min_size=1, max_size=16).filter(any),
                  st.integers(1, 600))
@hypothesis.settings(max_examples=200, deadline=None)
def test_allocate_properties(raw, batch_size):
  w = np.array(raw, np.float64) / sum(raw)
  counts = allocate(w, batch_size)
  quota = w * batch_size
  assert counts.sum() == batch_size
  assert np.all(np.abs(counts - quota) < 1 + 1e-9)       # each count is floor or ceil of its quota
  assert np.all(counts[w == 0] == 0)
  # largest remainder: every source that got the extra row has a fraction >= every one that did not
  # (quotas within 1e-9 of an integer count as that integer).
  base = np.floor(quota + 1e-9)
  frac = quota - base
  up = counts > base
  if up.any() and (~up & (w > 0)).any():
    assert frac[up].min() >= frac[~up & (w > 0)].max() - 1e-9


@pytest.mark.parametrize("weights, match", [
    ([0.5, np.nan, 0.5], "index 1.*not finite"),
    ([0.5, np.inf, 0.5], "not finite"),
    ([0.6, -0.1, 0.5], "index 1.*< 0"),
    ([0.5, 0.4], "sum to 0.9"),
])
def test_allocate_rejects_bad_weights(weights, match):
  with pytest.raises(ValueError, match=match):
    allocate(np.array(weights), 8)


def test_allocate_names_the_source_and_checks_batch_size():
  w = np.full(16, 1 / 16)
  w[7] = -w[7]
  with pytest.raises(ValueError, match="'dictionary'"):
    allocate(w, 16, SOURCES)
  with pytest.raises(ValueError, match="allocate: batch_size must be >= 1, got 0"):
    allocate(np.ones(2) / 2, 0)
  with pytest.raises(TypeError, match="allocate: batch_size must be an integer, got 4.0"):
    allocate(np.ones(2) / 2, 4.0)
  assert np.allclose(allocate(np.array([0.5 + 4e-6, 0.5]), 4), [2, 2])  # within tolerance
  with pytest.raises(ValueError, match=r"allocate: offset must be in \[0, 1\), got 1.0"):
    allocate(np.ones(2) / 2, 4, offset=1.0)


def test_systematic_allocation_worked_examples():
  # Quotas 3, 1.5, 1.5: one leftover row; the fractions 0.5, 0.5 laid end to end as [0, 0.5) and
  # [0.5, 1): the point u goes to the first for u < 0.5, to the second from 0.5 on.
  w = np.array([0.5, 0.25, 0.25, 0.0])
  assert allocate(w, 6, offset=0.2).tolist() == [3, 2, 1, 0]
  assert allocate(w, 6, offset=0.7).tolist() == [3, 1, 2, 0]
  # order_S puts source 2 first: now it holds [0, 0.5).
  assert allocate(w, 6, offset=0.2, order_S=np.array([3, 2, 1, 0])).tolist() == [3, 1, 2, 0]
  # Quotas 0.7, 2.1, 0.2 (fractions 0.7, 0.1, 0.2 in index order, one row left): segments
  # [0, 0.7), [0.7, 0.8), [0.8, 1).
  w = np.array([0.7, 2.1, 0.2]) / 3
  assert [allocate(w, 3, offset=u).tolist() for u in (0.1, 0.75, 0.9)] == [
      [1, 2, 0], [0, 3, 0], [0, 2, 1]]
  # Whole quotas (1/16 of 32 rows, with float noise) never move, whatever the offset.
  for u in (0.0, 0.3, 0.999999):
    assert allocate(np.full(16, 1 / 16), 32, offset=u).tolist() == [2] * 16
  # Quotas 0.999999, ten of 4e-7 (0 in millionths of a row) and 0.999997 rows: the fractions sum to
  # 1.999996 for R = 2 rows, so rescaled the first segment is [0, 1.000001) and at u = 0 holds both
  # points 0 and 1. A source never gets more than its ceiling, 1 row: the second row goes to the
  # largest fraction without one, the last source.
  q = np.array([0.999999] + [4e-7] * 10 + [0.999997])
  assert allocate(q / 2, 2, offset=0.0).tolist() == [1] + [0] * 10 + [1]


@hypothesis.given(st.lists(st.integers(0, 1000), min_size=1, max_size=16).filter(any),
                  st.integers(1, 200), st.randoms(use_true_random=False))
@hypothesis.settings(max_examples=60, deadline=None)
def test_systematic_allocation_is_unbiased(raw, batch_size, rnd):
  """Over a grid of N offsets, a segment of length f holds a point for a fraction of them within
  1/N of f: the mean count is the quota ``w G`` to 1/N (floor or ceil every time)."""
  w = np.array(raw, np.float64) / sum(raw)
  order = np.array(rnd.sample(range(len(raw)), len(raw)))
  n = 400
  counts = np.array([allocate(w, batch_size, offset=(i + 0.5) / n, order_S=order)
                     for i in range(n)])
  quota = w * batch_size
  assert np.all(counts.sum(axis=1) == batch_size)
  assert np.all(np.abs(counts - quota) < 1 + 1e-9) and np.all(counts[:, w == 0] == 0)
  np.testing.assert_allclose(counts.mean(axis=0), quota, atol=1 / n + 1e-6)


def test_realised_shares():
  assert realised_shares(np.array([6, 2, 0])).tolist() == [0.75, 0.25, 0.0]


# --- batches ------------------------------------------------------------------------------------

def test_batch_shapes_dtypes_and_exact_counts(data):
  w = _one_hot((0, 0.5), (3, 0.25), (7, 0.125), (15, 0.125))
  batch = MixtureSampler(data, seq_len=SEQ, global_batch_size=24, seed=3).batch(5, w)
  assert set(batch) == {"inputs", "targets", "segment_ids", "positions", "source_ids"}
  for k in ("inputs", "targets", "segment_ids", "positions"):
    assert batch[k].shape == (24, SEQ) and batch[k].dtype == np.int32
  assert batch["source_ids"].shape == (24,) and batch["source_ids"].dtype == np.int32
  # Laid out source by source: 12 rows of source 0, 6 of 3, 3 of 7, 3 of 15.
  assert batch["source_ids"].tolist() == [0] * 12 + [3] * 6 + [7] * 3 + [15] * 3
  np.testing.assert_array_equal(batch["inputs"][:, 1:], batch["targets"][:, :-1])


def test_rows_are_windows_of_their_own_source(data):
  w = np.full(16, 1 / 16)
  batch = MixtureSampler(data, seq_len=SEQ, global_batch_size=32, seed=1).batch(2, w)
  streams = {s: _stream(data, s) for s in SOURCES}
  for r in range(32):
    window = np.concatenate([batch["inputs"][r], batch["targets"][r, -1:]])
    src = SOURCES[batch["source_ids"][r]]
    assert _find(streams[src], window), f"row {r} is not a window of {src}"
    assert not _find(_stream(data, src, "eval"), window)


def test_exact_counts_for_many_mixtures(data):
  sampler = MixtureSampler(data, seq_len=SEQ, global_batch_size=40, seed=0)
  rng = np.random.default_rng(1)
  for step in range(20):
    w = rng.dirichlet(np.full(16, 0.3))
    counts = np.bincount(sampler.batch(step, w)["source_ids"], minlength=16)
    np.testing.assert_array_equal(counts, sampler.counts(w, step))
    assert np.all(np.abs(counts - 40 * w) < 1)


def test_batches_realise_the_mixture_on_average_over_steps(data):
  # The polish region at a 32-row batch: hermes3-general 0.7 (22.4 rows), 13 sources at 0.3/13
  # (0.738 rows each), 2 excluded. Largest remainder would give 22 rows and the 10 leftover rows
  # to the same 10 of the 13 tied sources every step; the sampler's counts must average the quotas
  # themselves over the steps.
  w = np.zeros(16)
  w[0] = 0.7
  tied = [i for i in range(1, 16) if i not in (8, 9)]
  w[tied] = 0.3 / 13
  sampler = MixtureSampler(data, seq_len=SEQ, global_batch_size=32, seed=0)
  counts = np.array([sampler.counts(w, step) for step in range(2000)])
  assert (counts.sum(axis=1) == 32).all() and (counts[:, [8, 9]] == 0).all()
  assert set(np.unique(counts[:, 0])) == {22, 23} and set(np.unique(counts[:, tied])) == {0, 1}
  # Binomial standard error of a mean of 2000 Bernoulli(0.4) draws: 0.011; allow 4 of them.
  np.testing.assert_allclose(counts[:, 0].mean(), 22.4, atol=0.045)
  np.testing.assert_allclose(counts[:, tied].mean(axis=0), 0.3 / 13 * 32, atol=0.04)
  # Without a step, largest remainder by index: 22 rows, and the last three tied sources get none.
  np.testing.assert_array_equal(sampler.counts(w)[tied], [1] * 10 + [0] * 3)
  batch = sampler.batch(7, w)
  np.testing.assert_array_equal(np.bincount(batch["source_ids"], minlength=16), counts[7])


@pytest.mark.parametrize("num_processes", [2, 4])
def test_process_slices_partition_the_global_batch(data, num_processes):
  w = np.random.default_rng(2).dirichlet(np.ones(16))
  whole = MixtureSampler(data, seq_len=SEQ, global_batch_size=48, seed=9).batch(11, w)
  parts = [MixtureSampler(data, seq_len=SEQ, global_batch_size=48, seed=9, process_index=p,
                          process_count=num_processes).batch(11, w) for p in range(num_processes)]
  for p in parts:
    assert p["inputs"].shape == (48 // num_processes, SEQ)
  for k in whole:
    np.testing.assert_array_equal(np.concatenate([p[k] for p in parts]), whole[k])


def test_stateless_resume_and_seed_and_step_dependence(data):
  w = np.full(16, 1 / 16)
  a = MixtureSampler(data, seq_len=SEQ, global_batch_size=32, seed=4)
  later = [a.batch(s, w)["inputs"] for s in range(6)]
  resumed = MixtureSampler(data, seq_len=SEQ, global_batch_size=32, seed=4)
  np.testing.assert_array_equal(resumed.batch(5, w)["inputs"], later[5])  # no iterator state
  for s in range(5):
    assert (later[s] != later[s + 1]).any(axis=1).mean() > 0.9
  other_seed = MixtureSampler(data, seq_len=SEQ, global_batch_size=32, seed=5).batch(5, w)
  assert (other_seed["inputs"] != later[5]).any(axis=1).mean() > 0.9


def test_window_starts_cover_the_source(data):
  stream = _stream(data, "chat")
  sampler = MixtureSampler(data, seq_len=SEQ, global_batch_size=16, seed=0)
  w = _one_hot((3, 1.0))
  starts = []
  for step in range(40):
    b = sampler.batch(step, w)
    for r in range(16):
      starts += _find(stream, np.concatenate([b["inputs"][r], b["targets"][r, -1:]]))[:1]
  hist = np.histogram(np.array(starts) / stream.size, bins=4, range=(0, 1))[0]
  assert len(starts) == 640 and hist.min() > 100   # 160 expected per quarter


def _reference_segments(inputs):
  seg, pos = np.zeros_like(inputs), np.zeros_like(inputs)
  for r in range(inputs.shape[0]):
    s, p = 1, 0
    for t in range(inputs.shape[1]):
      if t > 0 and inputs[r, t] == EOD:
        s, p = s + 1, 0
      elif t > 0:
        p += 1
      seg[r, t], pos[r, t] = s, p
  return seg, pos


def test_segments_and_positions_match_a_slow_loop(data):
  w = np.full(16, 1 / 16)
  sampler = MixtureSampler(data, seq_len=SEQ * 8, global_batch_size=16, seed=0)
  batch = sampler.batch(0, w)
  assert (batch["inputs"] == EOD).sum() > 10  # the windows do cross documents
  seg, pos = _reference_segments(batch["inputs"])
  np.testing.assert_array_equal(batch["segment_ids"], seg)
  np.testing.assert_array_equal(batch["positions"], pos)


def test_hand_packed_row():
  from andrea_jax.data import pack_rows
  b = pack_rows(np.array([[EOD, 5, 6, EOD, EOD, 7, 8]]), EOD, np.array([2]))
  assert b["inputs"].tolist() == [[EOD, 5, 6, EOD, EOD, 7]]
  assert b["targets"].tolist() == [[5, 6, EOD, EOD, 7, 8]]
  assert b["segment_ids"].tolist() == [[1, 1, 1, 2, 3, 3]]
  assert b["positions"].tolist() == [[0, 1, 2, 0, 0, 1]]
  assert b["source_ids"].tolist() == [2]


def test_batch_argument_errors(data):
  with pytest.raises(ValueError, match="not divisible by process_count"):
    MixtureSampler(data, seq_len=SEQ, global_batch_size=10, seed=0, process_count=4)
  with pytest.raises(ValueError, match="process_index"):
    MixtureSampler(data, seq_len=SEQ, global_batch_size=8, seed=0, process_index=2, process_count=2)
  sampler = MixtureSampler(data, seq_len=SEQ, global_batch_size=8, seed=0)
  with pytest.raises(ValueError, match="shape"):
    sampler.batch(0, np.ones(15) / 15)
  with pytest.raises(ValueError, match="MixtureSampler.batch: step must be >= 0, got -1"):
    sampler.batch(-1, np.ones(16) / 16)
  with pytest.raises(ValueError, match="MixtureSampler: seq_len must be >= 1, got 0"):
    MixtureSampler(data, seq_len=0, global_batch_size=8, seed=0)
  with pytest.raises(TypeError, match="MixtureSampler: process_index must be an integer, got True"):
    MixtureSampler(data, seq_len=SEQ, global_batch_size=8, seed=0, process_index=True)


def test_absent_source_with_weight_is_a_data_error(tmp_path):
  path = tmp_path / "chat.jsonl"
  path.write_text(json.dumps({"text": "x" * 500}) + "\n")
  out = str(tmp_path / "p")
  prepare({"chat": SourceSpec(paths=(str(path),), eval_fraction=0.0)}, load_tokenizer("bytes"), out,
          progress=False)
  data = PreparedData.open(out, required=["chat"])
  sampler = MixtureSampler(data, seq_len=SEQ, global_batch_size=4, seed=0)
  assert (sampler.batch(0, _one_hot((3, 1.0)))["source_ids"] == 3).all()
  with pytest.raises(DataError, match="step 7: source 'oasst' has weight 0.5 but 0 training"):
    sampler.batch(7, _one_hot((3, 0.5), (5, 0.5)))
  with pytest.raises(DataError,
                     match=r"source 'chat' has 501 train tokens, fewer than seq_len \+ 1 = 601"):
    MixtureSampler(data, seq_len=600, global_batch_size=4, seed=0)
  # Enough tokens, but in shards smaller than a window (a window never crosses shards).
  small = str(tmp_path / "small")
  prepare({"chat": SourceSpec(paths=(str(path),), eval_fraction=0.0)}, load_tokenizer("bytes"),
          small, shard_tokens=37, progress=False)
  data = PreparedData.open(small, required=["chat"])
  with pytest.raises(DataError, match=r"source 'chat' has 501 train tokens, but no train shard "
                                      r"holds seq_len \+ 1 = 41 \(the largest holds 37; a window "
                                      r"does not cross shards\)"):
    MixtureSampler(data, seq_len=40, global_batch_size=4, seed=0)


def test_eval_batches_are_fixed_windows_of_the_eval_split(data):
  b = eval_batches(data, "gutenberg", seq_len=SEQ, num_sequences=8)
  assert b["inputs"].shape == (8, SEQ) and b["segment_ids"].shape == (8, SEQ)
  sampler = MixtureSampler(data, seq_len=SEQ, global_batch_size=8, seed=5)
  again = sampler.eval_batches("gutenberg", 8)
  for k in b:
    np.testing.assert_array_equal(again[k], b[k])   # fixed: no seed, no step
  assert (b["source_ids"] == SOURCES.index("gutenberg")).all()
  stream = _stream(data, "gutenberg", "eval")
  assert len(data.shards("gutenberg", "eval")) == 1
  starts = [_find(stream, np.concatenate([b["inputs"][r], b["targets"][r, -1:]]))[0]
            for r in range(8)]
  valid = stream.size - SEQ  # windows of SEQ+1 tokens (single eval shard here)
  assert starts == [k * valid // 8 for k in range(8)]
  seg, pos = _reference_segments(b["inputs"])
  np.testing.assert_array_equal(b["segment_ids"], seg)
  np.testing.assert_array_equal(b["positions"], pos)
  halves = [eval_batches(data, "gutenberg", seq_len=SEQ, num_sequences=8, process_index=p,
                         process_count=2)["inputs"] for p in range(2)]
  np.testing.assert_array_equal(np.concatenate(halves), b["inputs"])
  with pytest.raises(DataError,
                     match=r"source 'gutenberg' has \d+ eval tokens, fewer than seq_len"):
    eval_batches(data, "gutenberg", seq_len=100_000, num_sequences=2)
  with pytest.raises(DataError, match="unknown source 'web'"):
    eval_batches(data, "web", seq_len=SEQ, num_sequences=2)
