r"""The zombie cliff (SPEC §2) on the built-in corpus: detected, attributed to repo-docs, excluded.

  .venv/bin/python experiments/zombie_cliff.py --workdir runs/zombie_cliff     # planted
  .venv/bin/python experiments/zombie_cliff.py --workdir runs/zombie_control --no-plant
  python -m andrea_jax.main --config=experiments/zombie_cliff.py --workdir=runs/zc  # = --no-plant

About 5 minutes on 2 idle CPU cores (9 on busy ones).

The run: the tiny model (4 layers, d_model 128) on the built-in corpus, 300 steps, logging every
step. One geometry gives repo-docs a big share: only ``chat``, ``extra-05`` and ``repo-docs``, each
1/3 (static phases of 7-13 steps). A floor on repo-docs would do it too, but a floor forbids the
remedy: excluding repo-docs (ceiling 0) would empty the region and the engine refuses it.

Expect (planted): at step 150 the repo-docs rows start carrying a passage the model has memorised;
the detector flags that step (robust z in the tens), names ``repo-docs``, and with
``cliff.respond`` the curriculum gives repo-docs weight exactly 0 from the next undecided phase on
(within ~15 steps): ``weight/repo-docs == 0`` in ``metrics.jsonl`` from there to the end. The
control (``--no-plant``) flags nothing.

**Why planted.** On the unmodified corpus the tiny model does not reach the ravine in CPU minutes.
repo-docs' five fixed passages (2.7-3.0 KB each, 65% of its bytes) are memorised gradually:
with repo-docs at half of every batch for 700 steps (lr 2e-3), their held-out loss was 1.34
nats/byte against 1.29 for the rest of repo-docs (no memorisation yet); trained on repo-docs alone
its loss fell linearly, 2.2 to 1.34 over 400 steps at lr 3e-3 (and stalled at 2.2 at lr 1e-2).
A linear decline can never be a cliff for this detector: the median of a window trailing a
straight line lags by half a window and the MAD grows with it, so the robust z stays at most
``(W/2) / (1.4826 * W/4) = 1.35`` whatever the window ``W``, far below the threshold 6; the
replayed detector peaked at z = 3.7 after warmup on that run. The cliff of step 112,080 is a
*sudden* fall: the memorised substring suddenly fills repo-docs' rows. The smallest honest change
that reproduces it here is exactly that: from ``PLANT_STEP`` on, the sampler's repo-docs rows carry
a substring of a real repo-docs passage that the model has already memorised, because the carrier
source ``extra-05`` carried it from step 0 (:func:`plant_passage`, a wrapper of
``MixtureSampler.batch``). Everything else (sampler, step, detector, curriculum, exclusion, logs) is
the real training system.
"""

from __future__ import annotations

import argparse
import contextlib

import ml_collections
import numpy as np

from andrea_jax import config as config_lib
from andrea_jax import data as data_lib
from andrea_jax.curriculum import geometry, set_mixer
from andrea_jax.sources import SOURCES

NUM_STEPS = 300
PLANT_STEP = 150        # first step whose repo-docs rows carry the memorised passage
CARRIER = "extra-05"    # the source that carries the passage from step 0 (the model memorises it)
# The opening words of one of repo-docs' fixed "Notice" passages (andrea_jax.data.styles).
PASSAGE = "Tonhoufi they to a up raiwuttro than sundlais louplitvu her is clound it that "


def get_config() -> ml_collections.ConfigDict:
  c = config_lib.base_config()
  c.train.update(num_steps=NUM_STEPS, log_every=1, checkpoint_every=0, plot=True)
  c.eval.update(every=0, sequences_per_source=8, sample_tokens=64)
  c.model.max_len = 128
  c.data.update(seq_len=128, global_batch_size=32)
  c.optim.update(peak_lr=2e-3, warmup_steps=20, weight_decay=0.1)
  g = ml_collections.ConfigDict()
  g.docs = geometry("docs", 0, only=("chat", CARRIER, "repo-docs"))
  c.curriculum.geometries = g
  # Equal weights, new phases every 7-13 steps: the exclusion lands within ~15 steps of a flag.
  c.curriculum.update(phase_min_steps=7, phase_max_steps=13)
  set_mixer(c, "static")
  # Armed after 100 steps on a 50-step window; a flagged source is excluded (the v3 polish remedy).
  c.cliff.update(window=50, warmup=100, cooldown=50, respond=True)
  return c


@contextlib.contextmanager
def plant_passage(text: str = PASSAGE, start_step: int = PLANT_STEP, source: str = "repo-docs",
                  carrier: str = CARRIER, tokenizer: data_lib.Tokenizer | None = None):
  """While active, batches carry ``text`` (repeated, at step-dependent offsets) in the rows of
  ``carrier`` at every step and in the rows of ``source`` from ``start_step`` on.

  It wraps :meth:`andrea_jax.data.MixtureSampler.batch` (restored on exit): rows keep their source
  ids, so the step's per-source losses, the detector and the curriculum see a ``source`` whose
  data suddenly turned into a memorised passage. Deterministic: a batch is still a pure function
  of ``(seed, step, weights)``.

  Example:
    >>> with plant_passage("z", start_step=30):
    ...   train.train_and_evaluate(config, workdir)
  """
  tokenizer = tokenizer or data_lib.load_tokenizer("bytes")
  passage_P = np.asarray(tokenizer.encode(text), np.int32)
  carrier_id, source_id = SOURCES.index(carrier), SOURCES.index(source)
  original = data_lib.MixtureSampler.batch

  def batch(self, step, weights):
    b = original(self, step, weights)
    planted = [carrier_id] + ([source_id] if step >= start_step else [])
    rows_R = np.flatnonzero(np.isin(b["source_ids"], planted))
    if rows_R.size:
      width = b["inputs"].shape[1] + 1
      offsets_R = (31 * step + 7 * rows_R) % passage_P.size
      windows_RxW = passage_P[(offsets_R[:, None] + np.arange(width)[None]) % passage_P.size]
      packed = data_lib.pack_rows(windows_RxW, self.data.eod_id, b["source_ids"][rows_R])
      for k in ("inputs", "targets", "segment_ids", "positions"):
        b[k][rows_R] = packed[k]
    return b

  data_lib.MixtureSampler.batch = batch
  try:
    yield
  finally:
    data_lib.MixtureSampler.batch = original


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--workdir", required=True)
  parser.add_argument("--no-plant", action="store_true", help="the control run: real data only")
  args = parser.parse_args()
  from andrea_jax import logs
  from andrea_jax import train

  config = get_config()
  with contextlib.ExitStack() as stack:
    if not args.no_plant:
      stack.enter_context(plant_passage())
    train.train_and_evaluate(config, args.workdir)
  records = [r for r in logs.read_jsonl(f"{args.workdir}/metrics.jsonl") if "loss" in r]
  flags = [(r["step"], r["cliff/source"], r["cliff/score"]) for r in records if "cliff/score" in r]
  excluded = [r["step"] for r in records if r["weight/repo-docs"] == 0.0]
  print(f"flags (step, source, robust z): {flags}")
  print(f"repo-docs weight 0 from step {excluded[0] if excluded else None} "
        f"({len(excluded)} of {len(records)} steps)")


if __name__ == "__main__":
  main()
