"""Data pipeline throughput: the mixture sampler on one CPU core, ``prepare`` with bytes and BPE,
and the standard-library corpus built cold and found in its cache.

  .venv/bin/python bench/data.py            # built-in corpus at scale 1 (~16 MB of text)
  .venv/bin/python bench/data.py --quick    # scale 0.25, fewer batches

Target for the standard-library corpus: built (cut, written, prepared with the byte tokenizer) in
under 30 s on 2 cores, the same bytes every time.
Target for the sampler: >= 5 M tokens/s on one core (B=64, T=1024), four times what an H100 consumes
training ANDREA-120M (about 1.2 M tokens/s at ~40% MFU: 6 * 1.2e8 * 1.2e6 = 8.6e14 FLOP/s).
The figures are from this machine, in one run; compare them as ratios, not as absolute times.
"""

from __future__ import annotations

import argparse
import os
import platform
import tempfile
import time

import numpy as np

from andrea_jax.data import (MixtureSampler, PreparedData, Prefetcher, builtin_documents,
                             generate_builtin, load_tokenizer, prepare, train_bpe)
from andrea_jax.data.corpus import BUILTIN_SHARD_TOKENS, builtin_specs
from andrea_jax.data.stdlib_corpus import STDLIB_SOURCES, ensure_stdlib
from andrea_jax.sources import SOURCES

TARGET_TOKENS_PER_S = 5e6
TARGET_STDLIB_S = 30.0


def _pin_one_core() -> str:
  if hasattr(os, "sched_setaffinity"):
    core = sorted(os.sched_getaffinity(0))[0]
    os.sched_setaffinity(0, {core})
    return f"pinned to core {core}"
  return "not pinned (no sched_setaffinity)"


def _time(fn, repeat: int) -> float:
  """Seconds per call: the best of three rounds of ``repeat`` calls."""
  best = float("inf")
  for _ in range(3):
    start = time.perf_counter()
    for i in range(repeat):
      fn(i)
    best = min(best, (time.perf_counter() - start) / repeat)
  return best


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--quick", action="store_true", help="smaller corpus and fewer batches")
  args = parser.parse_args()
  scale, batches = (0.25, 20) if args.quick else (1.0, 100)
  rows = []

  with tempfile.TemporaryDirectory() as tmp:
    for label in ("cold", "cached"):
      start = time.perf_counter()
      path = ensure_stdlib(os.path.join(tmp, "stdlib"), load_tokenizer("bytes"))
      sec = time.perf_counter() - start
      tokens = sum(PreparedData.open(path, sources=STDLIB_SOURCES, verify=False).num_tokens(s, sp)
                   for s in STDLIB_SOURCES for sp in ("train", "eval"))
      verdict = "meets" if sec < TARGET_STDLIB_S else "MISSES"
      note = (f"{tokens / 1e6:.1f} M byte tokens, {len(STDLIB_SOURCES)} sources; {verdict} the "
              f"{TARGET_STDLIB_S:.0f} s target; Python {platform.python_version()}")
      rows.append((f"stdlib corpus, ensure_stdlib ({label})", f"{sec:8.2f}", "s", note))

    start = time.perf_counter()
    paths = generate_builtin(os.path.join(tmp, "raw"), scale)
    gen_s = time.perf_counter() - start
    mb = sum(os.path.getsize(p) for p in paths.values()) / 1e6
    rows.append(("built-in corpus generation", f"{mb / gen_s:8.1f}", "MB/s",
                 f"{mb:.1f} MB, 16 sources, {gen_s:.2f} s"))

    byte_tok = load_tokenizer("bytes")
    bpe = train_bpe((d for s in SOURCES for d in builtin_documents(s, 0.05)), 4096,
                    os.path.join(tmp, "bpe.json"))
    specs = builtin_specs(os.path.join(tmp, "raw"))
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    for name, tok, workers in (("bytes", byte_tok, 1), ("BPE 4096", bpe, 1),
                               ("BPE 4096", bpe, cores)):
      out = os.path.join(tmp, f"prepared-{tok.fingerprint[:8]}-{workers}")
      start = time.perf_counter()
      prepare(specs, tok, out, shard_tokens=BUILTIN_SHARD_TOKENS, workers=workers, progress=False)
      sec = time.perf_counter() - start
      rows.append((f"prepare, {name}, {workers} worker(s)", f"{mb / sec:8.1f}", "MB/s",
                   f"{sec:.2f} s incl. hashing and writing"))

    data = PreparedData.open(os.path.join(tmp, f"prepared-{byte_tok.fingerprint[:8]}-1"),
                             tokenizer=byte_tok)
    sampler = MixtureSampler(data, seq_len=1024, global_batch_size=64, seed=0)
    uniform = np.full(len(SOURCES), 1 / len(SOURCES))
    mixtures = np.random.default_rng(0).dirichlet(np.full(len(SOURCES), 0.5), size=batches)
    tokens = 64 * 1024

    # Before pinning: the producer thread and the consumer may use two cores, as in training.
    start = time.perf_counter()
    with Prefetcher(lambda i: sampler.batch(i, mixtures[i % batches]), 0, depth=2,
                    end_step=batches) as it:
      for _ in it:
        pass
    rate = tokens * batches / (time.perf_counter() - start)
    rows.append(("sampler through Prefetcher (depth 2)", f"{rate / 1e6:8.1f}", "M tok/s",
                 "producer thread, consumer does nothing; not pinned"))

    note = _pin_one_core()
    for label, fn in (
        ("sampler B=64 T=1024, uniform mixture", lambda i: sampler.batch(i, uniform)),
        ("sampler B=64 T=1024, new mixture each step", lambda i: sampler.batch(i, mixtures[i])),
    ):
      rate = tokens / _time(fn, batches)
      verdict = "meets" if rate >= TARGET_TOKENS_PER_S else "MISSES"
      rows.append((label, f"{rate / 1e6:8.1f}", "M tok/s",
                   f"{verdict} the 5 M tok/s target; {note}"))

  width = max(len(r[0]) for r in rows)
  print(f"{'measure':<{width}}  {'value':>8}  {'unit':<7}  note")
  print("-" * (width + 60))
  for label, value, unit, extra in rows:
    print(f"{label:<{width}}  {value:>8}  {unit:<7}  {extra}")


if __name__ == "__main__":
  main()
