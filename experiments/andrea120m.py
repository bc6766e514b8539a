r"""The real ANDREA-120M run, 200K steps, in the three versions of the source document.

  python -m andrea_jax.data.prepare --config=experiments/andrea120m.py:v3
  python -m andrea_jax.main --config=experiments/andrea120m.py:v3 --workdir=runs/andrea120m_v3

one process per host (8 GPUs each; see docs/launching.md for several hosts and TPU VMs). The first
command prepares every source once (on one machine, before the launch, into ``data.cache_dir``:
shared by the hosts), the second trains on it.

Data (the argument's second part, ``v3:hub`` by default): ``hub`` reads the sources from public
Hugging Face datasets where one is named with confidence (:data:`andrea_jax.data.hub.andrea_sources.
HUB_SOURCES`: smoltalk, oasst, gutenberg and chat); the other twelve are left for you to point at
your data (``--config.data.files.<source>.paths=...``, or ``.format=hf`` with ``.dataset=...``),
and the run refuses to start while any source it samples has no data, naming them all.
``synthetic`` trains on the synthetic built-in corpus instead (no data needed: the speed
benchmarks run so, e.g. ``--config=experiments/andrea120m.py:v2:synthetic``).

Variants (the argument's first part):
  v1 -- AdamW's first step at the peak rate 3e-4 (warmup_steps = 0) on the full simplex from step 0:
        v2 introduced both warmups (the learning-rate ramp and the seven-source curriculum warmup).
  v2 -- a 2000-step linear learning-rate warmup; the curriculum starts on the seven warmup sources
        (the 6-D sub-simplex) and opens to all sixteen at step 20K.
  v3 -- v2 plus the polish pivot at step 112,619 (repo-docs and repo-docstrings excluded,
        hermes3-general >= 0.7, dictionary <= 0.25), the whole run chaining the three geometries.

Hardware: sized for one host of 8x H100 80GB (pure data parallelism: mesh.data = 8; the 124M
parameters and their moments fit on every GPU, so FSDP is not needed). A step is 512 sequences of
1024 tokens = 524,288 tokens (0.5M, GPT-2-small's batch), 64 rows per GPU, run as 2 micro-batches of
32 (optim.grad_accum_steps = 2) to leave room for the float32 logits of a 50K vocabulary. At the
bench/gpu.py target (470K tokens/s per H100) 200K steps = 105B tokens take about 8 hours with
the GPT-2 vocabulary. That target is plain causal attention; this run keeps the document mask
(train.document_mask = True, packed rows attend within their own documents), which cuDNN runs as
a dense bias and whose backward also computes a bias gradient nobody uses: expect it slower
(bench/model.py's "packed" rows measure it), or pass --config.train.document_mask=False for
GPT-2's plain causal attention.

What to expect (the source document's account; this software was not run at this scale here):
v1 risks the bad basin the document describes (the samples repeating one word, "region region
region": watch eval/repetition); v2 trains smoothly; v3 pivots at 112,619 and its loss curve shows
no zombie cliff (a loss far below its recent values, which the cliff detector would report).

What the source document does not fix, chosen here as a careful practitioner would for a
GPT-2-small-sized model (and marked "not in the seed" below): batch, context, vocabulary, the decay
after the warmup, weight decay, betas, clipping, evaluation and checkpoint cadence.
"""

import ml_collections

from andrea_jax import config as config_lib
from andrea_jax.curriculum import andrea_geometries, geometry
from andrea_jax.data import set_source
from andrea_jax.data.hub.andrea_sources import HUB_SOURCES
from andrea_jax.model import andrea_120m

NUM_STEPS = 200_000                         # the seed: a 200K-step run
VARIANTS = ("v1", "v2", "v3")
DATA = ("hub", "synthetic")


def get_config(spec: str = "v2") -> ml_collections.ConfigDict:
  """``variant[:data]``: v1, v2 or v3, on the Hub datasets (default) or the synthetic corpus."""
  variant, _, data = spec.partition(":")
  data = data or "hub"
  if variant not in VARIANTS or data not in DATA:
    raise ValueError(f"experiments/andrea120m.py takes one of {VARIANTS} after the colon, then "
                     f"optionally one of {DATA}, got {spec!r}")
  c = config_lib.base_config()
  c.train.num_steps = NUM_STEPS

  # ANDREA-120M = GPT-2 small: 12 layers, 12 heads, d_model 768 (d_k 64), MLP 3072, context 1024;
  # bf16 compute, float32 master weights and optimizer moments.
  c.model.update(andrea_120m(dtype="bfloat16").to_dict())
  # Vocabulary (not in the seed): GPT-2's 50,257 rows, so that the model is ANDREA-120M's
  # 124,475,904 parameters (the seed's "point in R^~120,000,000") whatever the tokenizer. The
  # tokenizer is bytes by default, so the config runs with no file at hand: it uses the first 257
  # rows, and the evaluation samples only those. For the GPT-2 BPE, point it at a tokenizers JSON:
  #   --config.data.tokenizer=/path/to/gpt2/tokenizer.json
  # (--config.model.vocab_size=0 takes the tokenizer's size: 86M parameters with bytes.)
  c.data.tokenizer = "bytes"
  c.model.vocab_size = 50_257
  if data == "hub":
    set_hub_sources(c)

  # Batch and context (not in the seed): GPT-2 small's 0.5M tokens per step, context 1024.
  c.data.seq_len = 1024
  c.data.global_batch_size = 512            # sequences per step over all devices
  c.optim.grad_accum_steps = 2              # 512 / 8 GPUs = 64 rows each, as 2 x 32 (memory)
  c.mesh.data, c.mesh.fsdp = -1, 1          # data parallel over every device

  # The optimizer: the seed fixes AdamW, peak 3e-4, and v2's 2000 warmup steps (v1: none).
  c.optim.peak_lr = 3e-4
  c.optim.warmup_steps = 0 if variant == "v1" else 2000
  # Not in the seed (nanoGPT / llm.c values for GPT-2 small): cosine decay to 10% of the peak,
  # betas (0.9, 0.95), weight decay 0.1 on matrices, global-norm clipping at 1.0.
  c.optim.schedule, c.optim.min_lr_ratio = "cosine", 0.1
  c.optim.b1, c.optim.b2, c.optim.weight_decay, c.optim.grad_clip = 0.9, 0.95, 0.1, 1.0

  # The curriculum: the seed's regimes over 200K steps; v1 and v2 never reached the polish, and v1
  # had no curriculum warmup either (v2 set curriculum_warmup_sources): all 16 sources from step 0.
  geometries = andrea_geometries(NUM_STEPS)
  if variant != "v3":
    del geometries["v3_polish"]
  if variant == "v1":
    geometries = ml_collections.ConfigDict({"v1_full_simplex": geometry("v1_full_simplex", 0)})
  c.curriculum.geometries = geometries

  # Cadence (not in the seed): log every 100 steps, evaluate and checkpoint every 2000 (~5 minutes).
  c.train.log_every = 100
  c.train.checkpoint_every = 2000
  c.train.keep_checkpoints = 3
  # The seed asks how wide the basin is at ~112K: every 16,000th checkpoint stays (step 112,000,
  # 619 steps before the v3 pivot, among the 12), for `python -m andrea_jax.terrain`.
  c.train.keep_period = 16_000
  c.eval.every = 2000
  c.eval.sequences_per_source = 16
  return c


def set_hub_sources(c: ml_collections.ConfigDict) -> None:
  """Points each source of :data:`HUB_SOURCES` at its verified dataset (``data.corpus = "files"``,
  ``format = "hf"``, streamed); the other sources keep no data, for the user to set."""
  c.data.corpus = "files"
  for source, verified in HUB_SOURCES.items():
    spec = verified.spec
    # Streamed: read as it is tokenized, no need to hold a whole dataset on disk.
    set_source(c, source, "hf", dataset=spec.dataset, split=spec.split,
               subset=spec.subset or "", layout=spec.layout, text_field=spec.text_field,
               messages_field=spec.messages_field, streaming=True)
