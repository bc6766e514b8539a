r"""Can a count model stand in for the proxy's probe runs? A screen, on the built-in corpus.

    python -m study.mixing.count_proxy [--out runs/compare_mixers] [--model pooled|source]

The designed proxy (``python -m study.mixing.fit_proxy``) fits each source's data elasticity on 20
probe *training runs*: ten runs' worth of compute at the proxy's size, the recipe's whole cost.
Here the 20 probe mixtures feed an n-gram count model instead: for each probe, one interpolated
absolute-discounting model (discount 0.75 at every order, add-1/2 unigram) counts the first
``round(share_s * tokens)`` training tokens of every source (``tokens``: what a probe of the
study has seen at the middle of its fitted window, 350 steps of 32 x 64), and each source's loss
is its mean log-loss on the first 20,000 tokens of its held-out split (all of it where shorter).
The same :func:`study.mixing.proxy.fit_elasticity` turns the 20 x 16 losses into
elasticities,
compared with the recorded transformer fits at 0.13M and 0.85M parameters
(``study/mixing/arms.py``: ``PROXY_HALF_ELASTICITY``, ``PROXY_HALF_4X128_ELASTICITY``).

The rule, fixed before any correlation was seen: the count model's order is the one whose mean
held-out loss under the uniform mixture is nearest the transformer proxy's mean training loss over
the probes' fitted window (steps 300-399 of ``python -m study.mixing.compare``'s uniform run of seed 0,
which is that probe: reused from ``<out>/runs/uniform/seed0``, or trained there, about a
minute); it would stand in for the probes if its fitted mixture (power 1.5) had Pearson r >= 0.9
with the 0.13M fit's. Prints one row per order (1 to ``--max-order``).

Found (``study/mixing/LOG.md``, "A count model instead of the probes?"): it does not stand in. At the
rule's order, 3, the mixture's r is 0.13 with the 0.13M fit's (0.05 with the 0.85M fit's). With
two tokens of context a count model cannot tell the sources apart (one model pooled over all the
sources): the noise source gets by far the largest elasticity (0.96, the next 0.43, against 0.08
for the transformer, which knows from its context which source it reads). Without the noise
source r(b) is 0.87 (0.76 at 0.85M); orders 5 and 6 turn it negative.

``--model source``, added after that finding and screened by the same rule (the order by the
same loss level, r >= 0.9 with the 0.13M fit's mixture at power 1.5), fixed before its numbers:
each source's held-out tokens are scored by a count model of that source's own training tokens,
discounted at every level down to the unigram, which backs off to the pooled model's order-k
probability of the same token in the same context (:func:`source_aware_losses`): a model that
knows which source it reads, as the transformer does, and still shares what the sources have in
common. Should it pass, the next step, also fixed now: its elasticities at power 1.5 held for the
first half of the run, then uniform, in ``python -m study.mixing.compare`` on the seeds and sizes of the
transformer fit's ``proxy_half_p15_early`` (0.13M, seeds 0-8). Found: it fails as well, r 0.15
at the rule's order (2), under 0.6 at every order; its elasticities are small and flat
(0.003-0.057 at order 2 but for the noise source's 0.099) and put five of the seven sources the
transformer values most at the bottom.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

TOKENS = 350 * 32 * 64   # a probe's tokens at the middle of its fitted window (steps 300-399)
EVAL_TOKENS = 20_000


def gram_keys(x: np.ndarray, n: int, base: int) -> np.ndarray:
  """The ``n``-grams of ``x`` as integers ``sum_i x[t + i] base^(n - 1 - i)``, ``[len(x) - n +
  1]`` (empty when ``x`` is shorter than ``n``)."""
  count = len(x) - n + 1
  key = np.zeros(max(count, 0), np.int64)
  for i in range(n):
    key = key * base + x[i:i + count]
  return key


class CountModel:
  r"""Interpolated absolute-discounting n-gram model over token ids ``[0, vocab)``.

  ``p_1(x) = (c(x) + add) / (N + add V)``; for ``j >= 2``, with ``h`` the ``j - 1`` previous
  tokens and ``h'`` its last ``j - 2``:

  .. math::
     p_j(x | h) = \frac{\max(c(h x) - D, 0) + D\, N_{1+}(h \cdot)\, p_{j-1}(x | h')}{c(h)}

  with ``c(h) = sum_x c(h x)``: ``h``'s count as a prefix, so a context never followed by a token
  inside a segment (seen only at a segment's end, or never) backs off to ``p_{j-1}``. Every order
  counts raw n-grams (not Kneser-Ney's continuation counts). n-grams are counted inside each
  segment, never across two (a segment is one source's tokens). ``0 < discount <= 1`` and ``add >
  0`` keep every ``p_j`` a distribution with no zero; so does a ``base`` (``token_probs``) that is
  one, positive and summing to 1 over the next token in every context.
  """

  def __init__(self, segments: Sequence[np.ndarray], order: int, vocab: int,
               discount: float = 0.75, add: float = 0.5):
    if not 1 <= order or vocab ** order >= 2 ** 63:
      raise ValueError(f"order must be >= 1 with vocab ** order below 2**63, got order {order} "
                       f"for a vocabulary of {vocab}")
    if not (0 < discount <= 1 and add > 0):
      raise ValueError(f"discount must be in (0, 1] and add > 0, got discount {discount!r} and "
                       f"add {add!r}")
    self.order, self.vocab, self.discount = order, vocab, discount
    segments = [np.asarray(s, np.int64) for s in segments]
    self.counts = np.bincount(np.concatenate(segments), minlength=vocab).astype(np.float64)
    self.unigram = (self.counts + add) / (self.counts.sum() + add * vocab)
    self.tables = []
    for j in range(2, order + 1):
      grams, counts = np.unique(np.concatenate([gram_keys(s, j, vocab) for s in segments]),
                                return_counts=True)
      contexts, first = np.unique(grams // vocab, return_index=True)
      self.tables.append((grams, counts, contexts, np.add.reduceat(counts, first) if len(first)
                          else counts, np.diff(np.append(first, len(grams)))))

  def _lookup(self, sorted_keys: np.ndarray, values: np.ndarray, keys: np.ndarray) -> np.ndarray:
    if not len(sorted_keys):
      return np.zeros(len(keys), values.dtype)
    i = np.minimum(np.searchsorted(sorted_keys, keys), len(sorted_keys) - 1)
    return np.where(sorted_keys[i] == keys, values[i], 0)

  def token_probs(self, x: np.ndarray, base: np.ndarray | None = None) -> np.ndarray:
    r"""``p(x[t] | x[t - order + 1 : t])`` for ``t = order - 1, ...``: ``[len(x) - order + 1]``.

    With ``base`` (another model's probabilities of the same tokens in the same contexts,
    ``[len(x) - order + 1]``) the unigram level is discounted like the others and backs off to it:
    ``p_1(x) = (max(c(x) - D, 0) + D N_{1+}(\cdot) base) / N``, where ``N_{1+}(\cdot)`` counts the
    distinct tokens seen (``base`` itself for a model that has counted nothing).
    """
    x = np.asarray(x, np.int64)
    k = self.order
    if base is None:
      p = self.unigram[x[k - 1:]]
    else:
      base = np.asarray(base, np.float64)
      if base.shape != (len(x) - k + 1,):
        raise ValueError(f"base must hold one probability per scored token, shape "
                         f"{(len(x) - k + 1,)}, got {base.shape}")
      c, n = self.counts[x[k - 1:]], self.counts.sum()
      p = ((np.maximum(c - self.discount, 0) + self.discount * np.count_nonzero(self.counts) * base)
           / n if n else base)
    for j, (grams, counts, contexts, context_counts, followers) in enumerate(self.tables, 2):
      keys = gram_keys(x, j, self.vocab)[k - j:]
      c = self._lookup(grams, counts, keys)
      ch = self._lookup(contexts, context_counts, keys // self.vocab)
      nh = self._lookup(contexts, followers, keys // self.vocab)
      seen = (np.maximum(c - self.discount, 0) + self.discount * nh * p) / np.maximum(ch, 1)
      p = np.where(ch > 0, seen, p)
    return p

  def log_loss(self, x: np.ndarray) -> float:
    """Mean negative log-probability (nats per token) of ``x``'s tokens after its first
    ``order - 1``."""
    return float(-np.log(self.token_probs(x)).mean())


def probe_segments(train: Sequence[np.ndarray], mixture: Sequence[float],
                   tokens: int) -> list[np.ndarray]:
  """What a probe of ``mixture`` has read of each source: its first ``round(mixture_s * tokens)``
  (at least 1) training tokens."""
  return [t[:max(1, int(round(w * tokens)))] for t, w in zip(train, mixture)]


def probe_losses(train: Sequence[np.ndarray], held_out: Sequence[np.ndarray],
                 mixture: Sequence[float], tokens: int, order: int, vocab: int) -> np.ndarray:
  """Each source's held-out loss ``[S]`` under one count model of the first ``round(mixture_s *
  tokens)`` (at least 1) training tokens of every source."""
  model = CountModel(probe_segments(train, mixture, tokens), order, vocab)
  return np.array([model.log_loss(h) for h in held_out])


def source_aware_losses(train: Sequence[np.ndarray], held_out: Sequence[np.ndarray],
                        mixture: Sequence[float], tokens: int, order: int,
                        vocab: int) -> np.ndarray:
  """Each source's held-out loss ``[S]``, as :func:`probe_losses` but with a model that knows
  which source it reads: source ``s``'s held-out tokens are scored by a count model of its own
  training tokens alone whose every level backs off, in the end, to the pooled model of every
  source's tokens (``CountModel.token_probs`` with ``base``: the pooled model's order-``order``
  probabilities of the same tokens in the same contexts)."""
  segments = probe_segments(train, mixture, tokens)
  pooled = CountModel(segments, order, vocab)
  return np.array([-np.log(CountModel([seg], order, vocab).token_probs(
      h, base=pooled.token_probs(h))).mean() for seg, h in zip(segments, held_out)])


def proxy_loss_level(run_dir: str, sources: Sequence[str]) -> float:
  """A uniform run's mean over sources of its training loss over steps 300-399 (the probes' fitted
  window: ``fit_proxy.late_losses`` with 400 steps and ``late`` 0.25)."""
  from study.mixing import fit_proxy
  return float(fit_proxy.late_losses(os.path.join(run_dir, "metrics.jsonl"), sources, 400,
                                     0.25).mean())


def main(argv: Sequence[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--out", default="runs/compare_mixers",
                      help="python -m study.mixing.compare's --out: its uniform run of seed 0 is reused "
                           "from there, or trained")
  parser.add_argument("--max-order", type=int, default=6)
  parser.add_argument("--model", choices=("pooled", "source"), default="pooled",
                      help="pooled: one count model of every source's tokens; source: each "
                           "source scored by its own counts backed off to the pooled model")
  args = parser.parse_args(argv)
  if not 1 <= args.max_order <= 7:
    parser.error(f"--max-order must be in [1, 7] (byte 7-grams fill an int64), "
                 f"got {args.max_order}")
  from study.mixing import compare as mixers
  exp = mixers.load_experiment()
  from andrea_jax import data as data_lib
  from study.mixing import proxy
  from andrea_jax.sources import SOURCES

  uniform_run = os.path.join(args.out, "runs", "uniform", "seed0")
  study = argparse.Namespace(num_steps=exp.NUM_STEPS, quick=False, data_scale=None, layers=None,
                             d_model=None)
  mixers.run_arm(mixers._config(exp, "uniform", 0, study), uniform_run)
  level = proxy_loss_level(uniform_run, SOURCES)
  config = exp.get_config("uniform")
  spec = data_lib.data_spec(config.data, config.sources)
  tokenizer = spec.tokenizer
  data = data_lib.open_training_data(spec, progress=False)
  train = [np.concatenate([np.asarray(m, np.int64) for m in data.shards(s, "train")])
           for s in SOURCES]
  held = [np.concatenate([np.asarray(m, np.int64) for m in data.shards(s, "eval")])[:EVAL_TOKENS]
          for s in SOURCES]
  mixtures = proxy.probe_mixtures(len(SOURCES))
  fits = {"0.13M": np.array(exp.PROXY_HALF_ELASTICITY),
          "0.85M": np.array(exp.PROXY_HALF_4X128_ELASTICITY)}
  uniform = np.full(len(SOURCES), 1 / len(SOURCES))
  losses_of = {"pooled": probe_losses, "source": source_aware_losses}[args.model]
  rows = []
  for order in range(1, args.max_order + 1):
    t0 = time.perf_counter()
    level_k = losses_of(train, held, uniform, TOKENS, order, tokenizer.vocab_size).mean()
    losses = np.array([losses_of(train, held, m, TOKENS, order, tokenizer.vocab_size)
                       for m in mixtures])
    fit = proxy.fit_elasticity(mixtures, losses)
    wall = time.perf_counter() - t0
    mix = proxy.elasticity_mixture(fit.b, power=1.5)
    row = [order, level_k, abs(level_k - level)]
    with np.errstate(invalid="ignore", divide="ignore"):   # a constant mixture: r undefined
      for b in fits.values():
        row += [np.corrcoef(fit.b, b)[0, 1],
                np.corrcoef(mix, proxy.elasticity_mixture(b, power=1.5))[0, 1],
                np.corrcoef(fit.b[:-1], b[:-1])[0, 1]]
    top = int(np.argmax(fit.b[:-1]))
    rows.append(row + [fit.b[-1], f"{fit.b[top]:.3f} ({SOURCES[top]})", wall])
  chosen = min(rows, key=lambda r: r[2])[0]
  print(f"count model: {args.model}")
  print(f"transformer proxy (0.13M, uniform) mean training loss over steps 300-399: {level:.3f} "
        f"({uniform_run})")
  print("| order | count model's mean held-out loss (uniform) | r(b) 0.13M | r(mixture^1.5) 0.13M "
        "| r(b) 0.13M without extra-06 | r(b) 0.85M | r(mixture^1.5) 0.85M | r(b) 0.85M without "
        "extra-06 | b of extra-06 | largest b of the 15 others | seconds (21 models) |")
  print("|" + "---|" * 11)
  for order, level_k, _, *rest, b_noise, top, wall in rows:
    mark = " (the rule's)" if order == chosen else ""
    print(f"| {order}{mark} | {level_k:.3f} | "
          + " | ".join(f"{v:+.2f}" if np.isfinite(v) else "- (uniform)" for v in rest)
          + f" | {b_noise:.3f} | {top} | {wall:.1f} |")
  if any(not np.isfinite(v) for row in rows for v in row[3:9]):
    print("- (uniform): every b at or under the 0.02 floor, so the mixture is uniform and has no r")
  r = next(row[4] for row in rows if row[0] == chosen)
  verdict = "passes" if np.isfinite(r) and r >= 0.9 else "fails"
  print(f"the rule: order {chosen}, r(mixture^1.5) with the 0.13M fit {r:+.2f}: {verdict} "
        f"(needs >= 0.9)")
  return 0


if __name__ == "__main__":
  sys.exit(main())
