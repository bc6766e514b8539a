"""Data pipeline throughput: the mixture sampler on one CPU core, ``prepare`` with bytes and BPE,
and the standard-library corpus built cold and found in its cache.

It also times ``prepare`` of the same Parquet rows through the ``datasets`` library (a
:class:`~andrea_jax.data.hub.datasets.HubSpec` over the file, loaded into a fresh ``datasets`` cache, then
streamed) against the direct Parquet reader, as a ratio measured in the same run; the shards must
come out identical.

  python -m bench.data            # built-in corpus at scale 1 (~16 MB of text)
  python -m bench.data --quick    # scale 0.25, fewer batches

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

from andrea_jax.data import (MixtureSampler, PreparedData, Prefetcher, load_tokenizer, prepare,
                             train_bpe)
from andrea_jax.data.corpora.synthetic import (BUILTIN_SHARD_TOKENS, builtin_documents,
                                               builtin_specs, generate_builtin)
from andrea_jax.data.corpora.stdlib import STDLIB_SOURCES, ensure_stdlib
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


def _hub_rows(tmp: str, scale: float, tok) -> list[tuple[str, str, str, str]]:
  """``prepare`` of one Parquet file: the direct reader against ``datasets`` (loaded, streamed)."""
  try:
    import datasets
  except ImportError:
    return [("prepare through datasets", "-", "", "skipped: pip install 'andrea_jax[hub]'")]
  import pyarrow as pa
  import pyarrow.parquet as pq

  from andrea_jax.data import SourceSpec
  from andrea_jax.data.hub.datasets import HubSpec

  docs = [d for s in SOURCES for d in builtin_documents(s, scale)]
  path = os.path.join(tmp, "rows.parquet")
  pq.write_table(pa.table({"text": docs}), path)
  mb = os.path.getsize(path) / 1e6
  datasets.disable_progress_bars()
  datasets.config.HF_DATASETS_CACHE = os.path.join(tmp, "hf_datasets_cache")
  # The first streaming load imports what streaming needs (torch too, when installed): a one-time
  # cost per process, timed apart on a one-row file so that the rows below compare reading alone.
  tiny = os.path.join(tmp, "tiny.parquet")
  pq.write_table(pa.table({"text": ["x"]}), tiny)
  start = time.perf_counter()
  for streaming in (True, False):
    datasets.load_dataset("parquet", data_files={"train": [tiny]}, split="train",
                          streaming=streaming)
  warmup = [("datasets, first load_dataset of a process", f"{time.perf_counter() - start:8.2f}",
             "s", "one-time imports (torch when installed), one-row file")]
  specs = (("direct Parquet reader", SourceSpec(paths=(path,), format="parquet")),
           ("datasets, load_dataset", HubSpec("parquet", data_files=(path,))),
           ("datasets, streaming", HubSpec("parquet", data_files=(path,), streaming=True)))
  # Best of three rounds, the three ways taking turns in each; every run starts from nothing (a
  # fresh output directory, and a fresh datasets cache, so load_dataset's Arrow conversion counts).
  seconds, shards = [float("inf")] * len(specs), [None] * len(specs)
  for r in range(3):
    for i, (_, spec) in enumerate(specs):
      out = os.path.join(tmp, f"hub-{r}-{i}")
      datasets.config.HF_DATASETS_CACHE = os.path.join(tmp, f"hf_datasets_cache-{r}-{i}")
      start = time.perf_counter()
      prepare({"chat": spec}, tok, out, workers=1, progress=False)
      seconds[i] = min(seconds[i], time.perf_counter() - start)
      shards[i] = {n: open(os.path.join(out, n), "rb").read() for n in sorted(os.listdir(out))
                   if n.endswith(".bin")}
  same = "identical shards" if shards[1] == shards[0] == shards[2] else "SHARDS DIFFER"
  rows = warmup + [(f"prepare {label}, bytes, 1 process", f"{mb / sec:8.1f}", "MB/s",
           f"{len(docs)} rows, {mb:.1f} MB Parquet, best of 3: {sec:.2f} s") for (label, _), sec in
          zip(specs, seconds)]
  for (label, _), sec in zip(specs[1:], seconds[1:]):
    rows.append((f"  time ratio {label} / direct", f"{sec / seconds[0]:8.2f}", "x", same))
  return rows


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

    rows += _hub_rows(tmp, scale, byte_tok)

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
