"""The mixture sampler: stateless, unbiasedly proportioned batches of packed windows from 16 sources.

A global batch of ``G`` rows for mixture ``w`` is laid out source by source, in source order:
``counts(w, step)`` rows of source 0, then of source 1, ... (``floor(w_s G)`` or one more, ``w_s
G`` on average over the steps: :func:`allocate` with an offset drawn from ``(seed, step)``). Each
row is a window of ``T + 1``
consecutive tokens of its source's training split, starting at a position drawn from a counter-based
hash (splitmix64) of ``(seed, step, source, row within the source)``. A batch is therefore a
pure function of ``(seed, step, w)``: resuming at step ``t`` needs no iterator state, and process
``p`` of ``P`` builds only its own rows ``[p G/P, (p+1) G/P)`` -- the slices of all processes
partition the global batch.

Rows are packed documents: every document starts with the end-of-document id, so ``segment_ids``
(1 at the row start, +1 at each end-of-document token) and ``positions`` (restarting at 0 at each
end-of-document token) give the model its document mask.

When a source of the run has loss masks (a conversation source prepared with ``loss_on`` other than
``"all"``: :mod:`andrea_jax.data.hub.masks`), every batch of the run also carries ``loss_mask``
``[B, T]`` uint8, the mask of each target (the same window of the mask shard, shifted as the
targets are; 1 for every target of a source without a mask). A run with no masked source gets
batches without it, exactly as before masks existed: the step it compiles, its memory and its
numbers are the same.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from andrea_jax import checks
from andrea_jax.data import hashing
from andrea_jax.data.errors import DataError
from andrea_jax.data.shards import PreparedData

WEIGHT_TOLERANCE = 1e-5


def _source_name(i: int, sources: tuple[str, ...] | None) -> str:
  return repr(sources[i]) if sources is not None and i < len(sources) else f"index {i}"


def _checked_weights(weights_S: np.ndarray, batch_size: int, sources: tuple[str, ...] | None,
                     offset: float | None) -> np.ndarray:
  """``weights_S`` as float64 once every argument of :func:`allocate` is valid."""
  checks.integer("allocate: batch_size", batch_size, minimum=1)
  checks.number("allocate: offset", offset, low=0, high=1, high_open=True, optional=True)
  w_S = np.asarray(weights_S, np.float64)
  if w_S.ndim != 1 or w_S.size == 0:
    raise ValueError(f"weights must be a non-empty 1-D vector, got shape {w_S.shape}")
  bad = np.flatnonzero(~np.isfinite(w_S))
  if bad.size:
    raise ValueError(f"weight of source {_source_name(bad[0], sources)} is {w_S[bad[0]]}, "
                     "not finite")
  bad = np.flatnonzero(w_S < 0)
  if bad.size:
    raise ValueError(f"weight of source {_source_name(bad[0], sources)} is {w_S[bad[0]]:.6g} < 0")
  total = float(w_S.sum())
  if abs(total - 1.0) > WEIGHT_TOLERANCE:
    raise ValueError(f"weights sum to {total:.8f}, not 1 (tolerance {WEIGHT_TOLERANCE})")
  return w_S


def allocate(weights_S: np.ndarray, batch_size: int,
             sources: tuple[str, ...] | None = None, *, offset: float | None = None,
             order_S: np.ndarray | None = None) -> np.ndarray:
  """Rows per source for mixture ``w`` in a batch of ``G`` rows: ``floor(w_s G)`` or one more.

  Every source gets ``floor(w_s G)`` rows; the ``R = G - sum floor(w G)`` leftover rows go to
  sources with a fractional part ``f_s = w_s G - floor(w_s G) > 0``:

  * ``offset=None``: by largest remainder (the ``R`` largest ``f_s``; ties, fractions equal to
    1e-6 of a row, by ``order_S`` then by index): deterministic, and biased: a mixture held for
    many steps is realised as the same rounded counts every step.
  * ``offset=u`` in ``[0, 1)``: by systematic sampling: the fractions laid end to end (in the
    order of ``order_S``, lower first, else by index), a row to each source whose segment holds one
    of the points ``u, u + 1, ..., u + R - 1``. A source gets its extra row for a fraction ``f_s``
    of the offsets, so with ``u`` uniform its expected count is exactly ``w_s G``: over the steps of
    a phase the batches realise the mixture itself, not its rounding. The sampler draws ``u`` and
    the order from ``(seed, step)``.

  Quotas within 1e-6 of a row of a whole number count as that number, so float noise never moves a
  row (``1/16`` of 32 rows is exactly 2).

  Args:
    weights_S: ``[S]`` mixture weights, finite, ``>= 0``, summing to 1 within 1e-5.
    batch_size: ``G``, rows in the global batch.
    sources: names used in error messages.
    offset: ``u`` in ``[0, 1)`` for systematic sampling, or None for largest remainder.
    order_S: optional ``[S]`` priorities (lower first) ordering the sources for either rule.

  Returns:
    ``[S]`` int64 counts summing to ``batch_size``; a source of weight 0 gets 0.

  Example:
    >>> allocate(np.array([0.5, 0.25, 0.25, 0.0]), 6).tolist()   # 3, 1.5, 1.5, 0 -> tie to index 1
    [3, 2, 1, 0]
    >>> allocate(np.array([0.5, 0.25, 0.25, 0.0]), 6, offset=0.7).tolist()  # points at 0.7
    [3, 1, 2, 0]
  """
  w_S = _checked_weights(weights_S, batch_size, sources, offset)
  total = float(w_S.sum())
  # Quotas in millionths of a row: float noise in equal weights must not decide anything.
  quota_S = np.round(w_S / total * batch_size * 1e6)
  counts_S = (quota_S // 1e6).astype(np.int64)
  remainder = int(batch_size - counts_S.sum())
  positive = np.flatnonzero(w_S > 0)
  frac_P = quota_S[positive] - counts_S[positive] * 1e6      # millionths, whole numbers
  prio_P = positive if order_S is None else np.asarray(order_S)[positive]
  if offset is None:
    order = positive[np.lexsort((positive, prio_P, -frac_P))]  # largest fraction first, then ties
    np.add.at(counts_S, order[np.arange(remainder) % order.size], 1)
    return counts_S
  order = np.lexsort((positive, prio_P))
  ends = np.cumsum(frac_P[order])
  if remainder <= 0 or ends[-1] <= 0:
    return counts_S
  # Scale the segments to exactly R rows (their sum is R up to the rounding to millionths).
  ends = ends * (remainder / ends[-1])
  ends[-1] = remainder
  starts = np.concatenate([[0.0], ends[:-1]])
  # Points u + m (m = 0 .. R - 1) in [start, end): ceil(end - u) - ceil(start - u); the sum
  # telescopes to exactly R. A segment stretched past one row by the rescaling (a fraction within
  # millionths of a row of 1) could hold two points: its second row goes to the largest fraction
  # left without one.
  extra = np.clip(np.ceil(ends - offset) - np.ceil(starts - offset), 0, 1).astype(np.int64)
  short = remainder - int(extra.sum())
  if short > 0:
    left = np.flatnonzero(extra == 0)
    extra[left[np.argsort(-frac_P[order][left], kind="stable")[:short]]] = 1
  np.add.at(counts_S, positive[order], extra)
  return counts_S


def realised_shares(counts_S: np.ndarray) -> np.ndarray:
  """``counts / sum(counts)``: the share of the batch each source really got (to log against ``w``).

  Example:
    >>> realised_shares(np.array([3, 1, 0])).tolist()
    [0.75, 0.25, 0.0]
  """
  counts_S = np.asarray(counts_S, np.float64)
  return counts_S / counts_S.sum()


def pack_rows(windows_BxW: np.ndarray, eod_id: int, source_ids_B: np.ndarray,
              masks_BxW: np.ndarray | None = None) -> dict[str, np.ndarray]:
  """Splits windows of ``T + 1`` tokens into a training batch with document segments.

  ``inputs = w[:, :-1]``, ``targets = w[:, 1:]``; ``segment_ids[t] = 1 + #{0 < u <= t: inputs[u] ==
  eod}``; ``positions[t] = t - (last u <= t with inputs[u] == eod, or 0)``; with ``masks_BxW`` (the
  windows' loss masks, one per token) ``loss_mask = m[:, 1:]``: whether the loss counts each
  target.

  Returns:
    ``inputs, targets, segment_ids, positions`` (``[B, T]`` int32), ``source_ids`` (``[B]`` int32),
    and with masks ``loss_mask`` (``[B, T]`` uint8).

  Example:
    >>> b = pack_rows(np.array([[5, 256, 7, 8, 256]]), 256, np.array([0]),
    ...               np.array([[0, 0, 1, 1, 0]]))
    >>> b["segment_ids"].tolist(), b["positions"].tolist(), b["loss_mask"].tolist()
    ([[1, 2, 2, 2]], [[0, 0, 1, 2]], [[0, 1, 1, 0]])
  """
  inputs_BxT = np.ascontiguousarray(windows_BxW[:, :-1], np.int32)
  targets_BxT = np.ascontiguousarray(windows_BxW[:, 1:], np.int32)
  B, T = inputs_BxT.shape
  is_eod_BxT = inputs_BxT == eod_id
  is_eod_BxT[:, 0] = False  # the row's first token opens segment 1 whatever it is
  segment_ids_BxT = np.cumsum(is_eod_BxT, axis=1, dtype=np.int32)
  segment_ids_BxT += 1
  t_T = np.arange(T, dtype=np.int32)
  start_BxT = np.where(is_eod_BxT, t_T, np.int32(0))
  np.maximum.accumulate(start_BxT, axis=1, out=start_BxT)
  batch = {"inputs": inputs_BxT, "targets": targets_BxT, "segment_ids": segment_ids_BxT,
           "positions": t_T - start_BxT,
           "source_ids": np.asarray(source_ids_B, np.int32).reshape(B)}
  if masks_BxW is not None:
    batch["loss_mask"] = np.ascontiguousarray(masks_BxW[:, 1:], np.uint8)
  return batch


class _Windows(NamedTuple):
  """Where windows of ``W`` tokens can start in one source split's shards."""
  views: tuple[np.ndarray, ...]  # per shard: [n_k - W + 1, W] read-only sliding-window view
  valid_K: np.ndarray   # [K] window starts in shard k (windows never cross shards)
  end_K: np.ndarray     # [K] cumsum(valid_K)
  total: int


def _windows(data: PreparedData, source: str, split: str, width: int,
             masks: bool = False) -> _Windows:
  """The windows of a source split's token shards (``masks``: of its mask shards, which start
  where the token windows start)."""
  arrays = [np.asarray(m) for m in (data.masks if masks else data.shards)(source, split)]
  views = tuple(sliding_window_view(a, width) if a.size >= width else a[:0, None] for a in arrays)
  valid_K = np.array([v.shape[0] for v in views], np.int64)
  end_K = np.cumsum(valid_K)
  return _Windows(views, valid_K, end_K, int(end_K[-1]) if views else 0)


def too_short(data: PreparedData, source: str, split: str, width: int) -> str:
  """Why ``source`` has no window of ``width`` tokens in ``split``: too few tokens, or shards too
  small to hold one (a window never crosses shards)."""
  total = data.num_tokens(source, split)
  if total < width:
    return f"source {source!r} has {total} {split} tokens, fewer than seq_len + 1 = {width}"
  largest = max((m.size for m in data.shards(source, split)), default=0)
  return (f"source {source!r} has {total} {split} tokens, but no {split} shard holds seq_len + 1 = "
          f"{width} (the largest holds {largest}; a window does not cross shards): prepare it "
          "with a larger data.shard_tokens")


def _gather(win: _Windows, u_R: np.ndarray, out_RxW: np.ndarray) -> None:
  """Copies the windows starting at global start indices ``u_R`` (in ``[0, win.total)``) to ``out``.

  Indexing the first axis of a sliding-window view copies whole rows (one contiguous run each):
  about 20x faster than gathering ``start + arange(W)`` element by element.
  """
  if len(win.views) == 1:
    out_RxW[:] = win.views[0][u_R]
    return
  k_R = np.searchsorted(win.end_K, u_R, side="right")
  off_R = u_R - (win.end_K[k_R] - win.valid_K[k_R])
  for k in np.unique(k_R):
    rows = np.flatnonzero(k_R == k)
    out_RxW[rows] = win.views[k][off_R[rows]]


class MixtureSampler:
  """Stateless batches for a mixture: ``batch(step, weights)`` is a pure function of its arguments.

  Example:
    >>> sampler = MixtureSampler(data, seq_len=256, global_batch_size=32, seed=0)
    >>> batch = sampler.batch(0, np.full(16, 1 / 16))
    >>> batch["inputs"].shape, np.bincount(batch["source_ids"], minlength=16).tolist()
    ((32, 256), [2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2])
  """

  def __init__(self, data: PreparedData, *, seq_len: int, global_batch_size: int, seed: int,
               process_index: int = 0, process_count: int = 1, split: str = "train"):
    """Indexes the shards of ``split`` of every present source.

    Args:
      data: opened prepared data; weight vectors follow ``data.sources``.
      seq_len: ``T``, tokens per row (windows hold ``T + 1``).
      global_batch_size: ``G``, rows over all processes.
      seed: the run's seed (any integer; taken mod 2**64).
      process_index, process_count: this process builds rows ``[p b, (p+1) b)``, ``b = G / P``.
      split: ``"train"`` (the training split: every required source must have a window) or
        ``"eval"`` (the held-out documents, for rows drawn at random from them, as the target
        gain's ``target_split = "eval"`` does; a source is checked when a batch weighs it).
    """
    for field, value, low in (("seq_len", seq_len, 1), ("global_batch_size", global_batch_size, 1),
                              ("process_count", process_count, 1),
                              ("process_index", process_index, 0)):
      checks.integer(f"MixtureSampler: {field}", value, minimum=low)
    if split not in ("train", "eval"):
      raise ValueError(f"split must be 'train' or 'eval', got {split!r}")
    if process_index >= process_count:
      raise ValueError(f"process_index {process_index} must be < process_count {process_count}")
    if global_batch_size % process_count:
      raise ValueError(f"global_batch_size {global_batch_size} is not divisible by process_count "
                       f"{process_count}")
    self.data, self.seq_len, self.global_batch_size = data, int(seq_len), int(global_batch_size)
    self.process_index, self.process_count = int(process_index), int(process_count)
    self.rows = self.global_batch_size // self.process_count
    self._seed, self.split = int(seed), split
    self._windows = {s: _windows(data, s, split, self.seq_len + 1) for s in data.sources}
    self._masks = {s: _windows(data, s, split, self.seq_len + 1, masks=True)
                   for s in data.masked_sources}
    for s in data.required if split == "train" else ():
      if self._windows[s].total == 0:
        raise DataError(too_short(data, s, split, self.seq_len + 1))

  def counts(self, weights_S: np.ndarray, step: int | None = None) -> np.ndarray:
    """``[S]`` rows per source of the global batch of ``step`` (:func:`allocate`).

    The leftover rows are placed by systematic sampling with an offset and an order of the sources
    drawn from ``(seed, step)``: each source gets ``floor(w G)`` or one more rows, ``w G`` on
    average over the steps, and the same on every process. ``step=None``: by largest remainder.
    """
    if step is None:
      return allocate(weights_S, self.global_batch_size, self.data.sources)
    key = np.uint64(hashing.hash_key(self._seed, step))
    salt = np.uint64(0x7A11B4EA4) + np.arange(len(self.data.sources) + 1, dtype=np.uint64)
    draws = hashing.splitmix64(key ^ salt)
    offset = float(draws[-1] >> np.uint64(11)) * 2.0 ** -53             # uniform in [0, 1)
    return allocate(weights_S, self.global_batch_size, self.data.sources, offset=offset,
                    order_S=draws[:-1])

  def batch(self, step: int, weights_S: np.ndarray) -> dict[str, np.ndarray]:
    """This process's rows of the global batch of ``step`` for mixture ``weights_S``.

    Returns:
      ``inputs, targets, segment_ids, positions``: ``[b, T]`` int32; ``source_ids``: ``[b]`` int32;
      when some source of the data has masks, ``loss_mask``: ``[b, T]`` uint8.
    """
    checks.integer("MixtureSampler.batch: step", step, minimum=0)
    weights_S = np.asarray(weights_S)
    if weights_S.shape != (len(self.data.sources),):
      raise ValueError(f"weights must have shape ({len(self.data.sources)},) (one per source), "
                       f"got {weights_S.shape}")
    counts_S = self.counts(weights_S, step)
    for s in np.flatnonzero(counts_S):
      if self._windows[self.data.sources[s]].total == 0:
        name = self.data.sources[s]
        raise DataError(f"step {step}: source {name!r} has weight {weights_S[s]:.6g} but "
                        f"{self.data.num_tokens(name, self.split)} "
                        f"{'training' if self.split == 'train' else 'held-out'} tokens (needs a "
                        f"shard of at least seq_len + 1 = {self.seq_len + 1})")
    begin_S = np.concatenate([[0], np.cumsum(counts_S)])
    lo, hi = self.process_index * self.rows, (self.process_index + 1) * self.rows
    g_B = np.arange(lo, hi)  # global row indices of this process
    source_ids_B = (np.searchsorted(begin_S, g_B, side="right") - 1).astype(np.int32)
    j_B = (g_B - begin_S[source_ids_B]).astype(np.uint64)  # row within its source
    key_S = hashing.splitmix64(
        np.uint64(hashing.hash_key(self._seed, step)) ^ np.arange(counts_S.size, dtype=np.uint64))
    hash_B = hashing.splitmix64(key_S[source_ids_B] ^ j_B)
    windows_BxW = np.empty((self.rows, self.seq_len + 1), np.int32)
    masks_BxW = np.ones((self.rows, self.seq_len + 1), np.uint8) if self._masks else None
    for s in np.flatnonzero(counts_S):
      a, b = max(begin_S[s], lo) - lo, min(begin_S[s + 1], hi) - lo  # the source's rows here
      if a < b:
        name = self.data.sources[s]
        win = self._windows[name]
        u_R = (hash_B[a:b] % np.uint64(win.total)).astype(np.int64)
        _gather(win, u_R, windows_BxW[a:b])
        if name in self._masks:
          _gather(self._masks[name], u_R, masks_BxW[a:b])
    return pack_rows(windows_BxW, self.data.eod_id, source_ids_B, masks_BxW)

  def eval_batches(self, source: str, num_sequences: int) -> dict[str, np.ndarray]:
    """:func:`eval_batches` with this sampler's data, ``seq_len`` and process slice."""
    return eval_batches(self.data, source, seq_len=self.seq_len, num_sequences=num_sequences,
                        process_index=self.process_index, process_count=self.process_count)


def eval_batches(data: PreparedData, source: str, *, seq_len: int, num_sequences: int,
                 process_index: int = 0, process_count: int = 1) -> dict[str, np.ndarray]:
  """Fixed windows of a source's held-out split, for its held-out loss.

  Window ``k`` of ``n = num_sequences`` starts at ``floor(k V / n)`` among the ``V`` valid starts
  (``V = N - T`` for one shard of ``N`` tokens), so the windows spread evenly over the split and are
  the same at every evaluation; consecutive windows overlap unless ``V >= n (T + 1)``. Process ``p`` of ``P`` gets windows
  ``[p n/P, (p+1) n/P)``.

  Returns:
    One batch shaped like :meth:`MixtureSampler.batch`, with ``num_sequences / process_count`` rows
    (``loss_mask`` too when some source of the data has masks, as the training batches do).

  Example:
    >>> eval_batches(data, "chat", seq_len=256, num_sequences=8)["inputs"].shape
    (8, 256)
  """
  if source not in data.sources:
    raise DataError(f"unknown source {source!r}; the run's sources are {list(data.sources)}")
  if num_sequences < 1 or num_sequences % process_count:
    raise ValueError(f"num_sequences must be a positive multiple of process_count {process_count}, "
                     f"got {num_sequences}")
  per_process = num_sequences // process_count
  win = _windows(data, source, "eval", seq_len + 1)
  if win.total == 0:
    why = too_short(data, source, "eval", seq_len + 1)
    raise DataError(why + ("; raise its eval_fraction and prepare again"
                           if data.num_tokens(source, "eval") < seq_len + 1 else ""))
  k_N = np.arange(process_index * per_process, (process_index + 1) * per_process, dtype=np.int64)
  u_N = (k_N * win.total) // num_sequences
  windows_NxW = np.empty((per_process, seq_len + 1), np.int32)
  _gather(win, u_N, windows_NxW)
  masks_NxW = None
  if data.masked_sources:
    masks_NxW = np.ones_like(windows_NxW, np.uint8)
    if source in data.masked_sources:
      _gather(_windows(data, source, "eval", seq_len + 1, masks=True), u_N, masks_NxW)
  return pack_rows(windows_NxW, data.eod_id,
                   np.full(per_process, data.sources.index(source), np.int32), masks_NxW)
