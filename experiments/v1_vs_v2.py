r"""v1 against v2 at small scale: the first step at the peak rate, or a linear warmup to it.

  python -m bench.v1_vs_v2            # the study: one table (about 10 min on 2 CPU cores)
  python -m bench.v1_vs_v2 --quick    # a smaller grid (about 2 min)

SPEC §2: v1 took its first AdamW step at the peak rate (3e-4) on fresh weights and kept producing
"region region region"; v2 ramped the rate from 0 over 2000 steps. Here both are trained in one
vmapped program (:mod:`andrea_jax.ablation`) on the same batches, over seeds, peak rates and
initialisation scales (depth needs its own program). v2's warmup is scaled to the run: 2000 of
200K steps is 1%, which on a 200-step run would be 2 steps, not a ramp; the study uses 10% (20
steps), the shortest warmup that is still a visible ramp at this length.

The batches: the sampler on the synthetic built-in corpus (ANDREA's sixteen source names, invented
languages: a conclusion drawn here need not transfer to real text; notebooks/warmup_ablation.ipynb
runs the same ablation on the real-text corpus) with the uniform mixture over v2's seven warmup
sources (the first phase of the ANDREA curriculum, ``ablation.default_mixture``), identical for
every variant. Samples: greedy and sampled (T = 0.8, top-20) continuations of three prompts,
scored by ``andrea_jax.repetition.repetition_score`` (a sample is "collapsed" at >= 0.5).
"""

from andrea_jax import config as config_lib

NUM_STEPS = 200
WARMUP = 20                       # v2-like warmup, 10% of the run (see above)
SEEDS = (0, 1, 2)
PEAK_LRS = (3e-3, 1e-2, 3e-2)     # 3e-3 is near experiments/tiny.py's 2e-3; the others are "high"
INIT_STDS = (0.02, 0.1)           # GPT-2's init, and a 5x larger one
DEPTHS = (4,)                     # layers; each depth is one compiled program


def get_config():
  c = config_lib.base_config()
  c.train.num_steps = NUM_STEPS
  # A 4-layer, 64-wide byte-level decoder on 16 x 64-token batches: ~36 variants train together
  # in a few minutes on a laptop CPU.
  c.model.update(num_layers=4, num_heads=4, d_model=64, d_mlp=256, max_len=128)
  c.data.update(seq_len=64, global_batch_size=16)
  c.optim.update(peak_lr=1e-2, warmup_steps=WARMUP, weight_decay=0.1, schedule="cosine")
  c.eval.update(sequences_per_source=4, sample_tokens=48, prompts=("The ", "Q: ", "def "))
  return c
