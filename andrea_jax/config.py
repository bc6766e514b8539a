"""The base run configuration: every knob of a training run, one commented field each.

Experiment files under ``experiments/`` start from :func:`base_config` and override a few fields; a user
overrides any field on the command line (``--config.optim.peak_lr=1e-3``). Sections:

* ``model``      -- the decoder's shape (becomes a frozen :class:`andrea_jax.model.ModelConfig`);
* ``data``       -- tokenizer, corpus and batch shape (:func:`andrea_jax.data.config.data_config`);
* ``optim``      -- AdamW, clipping and the learning-rate schedule;
* ``curriculum`` -- the mixer, its phases and the geometries of the mixture (:mod:`andrea_jax.curriculum`);
* ``probes``     -- in-step measurements, each source's target gain among them (:mod:`.probes`);
* ``train``      -- run length, logging, checkpoints;
* ``eval``       -- held-out loss and text samples;
* ``cliff``      -- the zombie-cliff detector (:mod:`andrea_jax.cliff`);
* ``init``       -- pretrained weights the run starts from (:mod:`andrea_jax.pretrained`);
* ``mesh``       -- the device mesh, data-parallel and fully-sharded axes (:mod:`.sharding`);
* ``distributed`` -- multi-host start-up (:mod:`andrea_jax.distributed`).
"""

from __future__ import annotations

import copy
import importlib.util
import os
from collections.abc import Sequence

import ml_collections

from andrea_jax.sources import SOURCES, check_sources, source_key


def model_section() -> ml_collections.ConfigDict:
  """The tiny decoder used by the demo and the tests (see ``ModelConfig`` for the field meanings)."""
  m = ml_collections.ConfigDict()
  m.vocab_size = 0          # tokens; 0 = take the tokenizer's vocabulary size
  m.max_len = 256           # tokens; context length of the learned position table
  m.num_layers = 4          # transformer blocks
  m.num_heads = 4           # attention heads per block (d_model must be a multiple)
  m.d_model = 128           # residual stream width
  m.d_mlp = 512             # hidden width of the GELU MLP (4 * d_model, as GPT-2)
  m.dtype = "float32"       # compute dtype: "float32" or "bfloat16" (parameters stay float32)
  m.remat = False           # rematerialise each block in the backward pass (saves memory, costs ~30%)
  m.attention_impl = "auto"  # "auto" (cuDNN on GPU when possible), "xla" or "cudnn"
  m.init_std = 0.02         # std of the normal initialiser (GPT-2)
  m.layer_norm_eps = 1e-5   # LayerNorm epsilon (GPT-2)
  m.vocab_multiple = 128    # pad the embedding table to a multiple of this (tensor-core friendly)
  return m


def optim_section() -> ml_collections.ConfigDict:
  """AdamW with global-norm clipping and a linear warmup then cosine decay.

  The source document fixes only the peak rate (3e-4) and v2's 2000 warmup steps; the rest are the
  GPT-2-small values a careful practitioner would pick (nanoGPT / llm.c): betas (0.9, 0.95), weight
  decay 0.1 on matrices only, clipping at 1.0, cosine decay to 10% of the peak.
  """
  o = ml_collections.ConfigDict()
  o.peak_lr = 3e-4          # learning rate at the end of the warmup
  o.warmup_steps = 2000     # steps of linear warmup from 0 to peak_lr; 0 = v1 (peak at step 0)
  o.schedule = "cosine"     # decay after warmup: "cosine", "wsd" (warmup-stable-decay) or "constant"
  o.decay_steps = 0         # "wsd" only: length of the final linear decay (0 = 20% of the run)
  o.min_lr_ratio = 0.1      # final learning rate as a fraction of peak_lr
  o.b1 = 0.9                # AdamW first-moment decay
  o.b2 = 0.95               # AdamW second-moment decay
  o.eps = 1e-8              # AdamW epsilon
  o.weight_decay = 0.1      # decoupled weight decay, on matrices (ndim >= 2) only
  o.grad_clip = 1.0         # global-norm clipping threshold; 0 disables
  o.grad_accum_steps = 1    # micro-batches accumulated per optimizer step (a scan inside the step)
  # the update after the clipping: "adamw", or "package.module:factory", a function
  # (OptimSpec, learning_rate) -> optax.GradientTransformation (andrea_jax.optim.update)
  o.name = "adamw"
  return o


def train_section() -> ml_collections.ConfigDict:
  t = ml_collections.ConfigDict()
  t.num_steps = 2000        # optimizer steps in the run
  # Stop after this many steps with a checkpoint and an evaluation, the learning-rate schedule and the
  # curriculum still laid out over num_steps: the run's first part (resume it with a larger value, or
  # 0). 0 = run to num_steps.
  t.stop_step = 0
  t.log_every = 20          # steps between metric reads (host syncs) and log lines
  t.checkpoint_every = 500  # steps between asynchronous checkpoints (also on SIGTERM/SIGINT and at the end)
  t.keep_checkpoints = 3    # newest checkpoints kept on disk
  t.keep_period = 0         # also keep every checkpoint at a multiple of this step (0 = none)
  t.max_nonfinite_steps = 5  # consecutive non-finite steps (skipped) before the run stops
  # Attention inside each packed document only (segment mask); False = plain causal over the row, as
  # GPT-2/nanoGPT trained: the fused cuDNN kernel's fastest path (no mask tensor), see bench/gpu.py.
  t.document_mask = True
  t.progress_bar = True     # tqdm progress bar on the console
  t.plot = True             # write summary.png at the end
  t.tensorboard = True      # write TensorBoard event files (tensorboardX) beside metrics.jsonl
  # periodic work of your own after a step: comma-separated "package.module:name", each a
  # Hook(every, fn) or a function of no arguments returning one (andrea_jax.hooks); "" = none
  t.hooks = ""
  return t


def eval_section(sources: Sequence[str] = SOURCES) -> ml_collections.ConfigDict:
  e = ml_collections.ConfigDict()
  e.every = 500             # steps between evaluations (held-out loss per source, samples); 0 = only at the end
  e.sequences_per_source = 8  # held-out windows per source for the evaluation loss
  e.prompts = ("The ", "Q: ", "def ")  # fixed prompts for text samples
  e.sample_tokens = 64      # tokens generated per sample
  e.temperature = 0.8       # sampling temperature (greedy samples are always taken too)
  e.top_k = 20              # top-k sampling; 0 = full distribution
  # the source mixture the run aims at (relative weights; all 0 = none): its held-out loss,
  # eval/target_loss, is reported beside the equal-weight mean (e.g. a corpus's declared target)
  e.target = ml_collections.ConfigDict({source_key(s): 0.0 for s in sources})
  # metrics of your own in each evaluation record: comma-separated "package.module:factory", each
  # factory(EvalContext) -> metric(params, step) -> {key: number} (andrea_jax.evaluate); "" = none
  e.metrics = ""
  # comma-separated sources the run evaluates (held-out loss; eval.target may weigh them) and never
  # trains on: every geometry gives them a ceiling of 0 ("" = none)
  e.untrained = ""
  return e


def terrain_section() -> ml_collections.ConfigDict:
  t = ml_collections.ConfigDict()
  # GiB the basin measurements (python -m andrea_jax.terrain) may allocate beyond the weights: they
  # evaluate perturbations and held-out windows in chunks sized to fit. 0 = automatic: half the
  # accelerator's memory as jax reports it, 2 GiB on a CPU.
  t.memory_budget_gib = 0.0
  return t


def init_section() -> ml_collections.ConfigDict:
  """Where the run's first weights come from: random (both empty), or one pretrained source."""
  i = ml_collections.ConfigDict()
  # A Hugging Face GPT-2 folder (config.json + model.safetensors, as save_pretrained and
  # `python -m andrea_jax.export` write it; its tokenizer, if any, must encode as data.tokenizer
  # does), or "hf:<repo>[@revision]" from the Hub (cached; needs the network once). "" = none.
  i.from_hf = ""
  # Another run's workdir, "DIR" (its newest checkpoint) or "DIR:STEP"; read only. "" = none.
  i.from_run = ""
  # Either way: parameters only (a fresh optimizer, step 0, the warmup from the start), used only
  # while the workdir has no checkpoint of its own; model.* must match the source's architecture
  # (a smaller model.max_len keeps the first positions). The source's path, SHA-256 and step are
  # added to this section in the run's recorded config.json.
  return i


def base_config(sources: Sequence[str] = SOURCES, corpus: str = "synthetic",
                mixer: str = "andrea") -> ml_collections.ConfigDict:
  """The whole run configuration with the tiny defaults; experiments override from here.

  ``sources`` are the run's (``config.sources``, the order of every weight vector; ANDREA's
  sixteen by default), ``corpus`` where their data comes from (``data.corpus``), ``mixer`` the
  curriculum's mixer (``curriculum.mixer.name``, with its own arguments only). Every section
  keyed by source (``data.files``, the curriculum's mixture and geometries) is built for them: over
  ANDREA's sixteen the curriculum is ANDREA's three regimes, over other sources the whole simplex.
  """
  # Imported here so that importing this module stays light.
  from andrea_jax.cliff import cliff_config
  from andrea_jax.curriculum.spec import curriculum_config
  from andrea_jax.data.config import data_config
  from andrea_jax.distributed import distributed_config
  from andrea_jax.sharding import mesh_section
  from andrea_jax.probes import probes_config

  sources = check_sources(sources)
  c = ml_collections.ConfigDict()
  c.seed = 0                # the run's one seed; every random stream is derived from it
  # the run's data sources, in the order of every mixture weight vector (names of letters, digits,
  # "-" and "_"; a config key writes "-" as "_"); change them with with_sources()
  c.sources = sources
  c.model = model_section()
  c.data = data_config(sources, corpus)
  c.optim = optim_section()
  c.curriculum = curriculum_config(sources=sources, mixer=mixer)
  # in-step measurements keyed by name (andrea_jax.probes), each a per-source signal for the mixers
  # and the logs: target_gain, how fast a step on each source lowers the target's loss (the
  # bandit's reward "target_gain"; off until probes.target_gain.every > 0)
  c.probes = probes_config(sources)
  c.train = train_section()
  c.eval = eval_section(sources)
  c.terrain = terrain_section()  # the basin-width report of a checkpoint (andrea_jax.terrain)
  c.cliff = cliff_config()  # the zombie-cliff detector (andrea_jax.cliff)
  c.init = init_section()   # pretrained weights to start from (andrea_jax.pretrained)
  c.mesh = mesh_section()   # device mesh (data, fsdp) and the FSDP rule (andrea_jax.sharding)
  c.distributed = distributed_config()  # multi-host start-up (andrea_jax.distributed)
  return c


def with_sources(config: ml_collections.ConfigDict, sources: Sequence[str], *,
                 geometries: ml_collections.ConfigDict | None = None
                 ) -> ml_collections.ConfigDict:
  """``config`` over other ``sources``: ``config.sources`` and every section keyed by source made
  anew for them, the rest kept.

  ``data.files`` and ``eval.target`` keep the entries of the sources that stay (the new get
  empty ones);
  ``curriculum.mixer`` keeps its arguments (a per-source one, e.g. a static mixture, its weights of
  the sources that stay, 1 for the new); ``curriculum.geometries`` becomes ``geometries``
  (default: the whole simplex over ``sources``, :func:`andrea_jax.curriculum.full_simplex`;
  :func:`andrea_jax.curriculum.three_regimes` gives ANDREA's curriculum over them).

  Example:
    >>> c = with_sources(load_config_file("experiments/tiny.py"), ["code", "docs", "reference"])
    >>> c.sources, sorted(c.data.files.keys())
    (('code', 'docs', 'reference'), ['code', 'docs', 'reference'])
  """
  from andrea_jax.curriculum import registry
  from andrea_jax.curriculum.geometries import full_simplex
  from andrea_jax.data.config import source_files

  sources = check_sources(sources)
  out = copy.deepcopy(config)
  with out.unlocked():
    out.sources = sources
    keep = out.data.files
    out.data.files = ml_collections.ConfigDict(
        {source_key(s): keep[source_key(s)] if source_key(s) in keep else source_files()
         for s in sources})
    out.curriculum.mixer = registry.for_sources(out.curriculum.mixer, sources)
    target = out.eval.target
    out.eval.target = ml_collections.ConfigDict(
        {source_key(s): target[source_key(s)] if source_key(s) in target else 0.0
         for s in sources})
    out.curriculum.geometries = full_simplex(sources) if geometries is None else geometries
  return out


def load_config_file(spec: str | os.PathLike) -> ml_collections.ConfigDict:
  """The config of a config file named as ``--config`` names it: ``path[:argument]``.

  Calls the file's ``get_config()``, or ``get_config(argument)`` when the name carries one
  (``experiments/tiny.py:v3_polish``). This is the project's one loader of files by path: config
  files are files (ml-collections loads ``--config`` the same way), and a config file that builds
  on another loads it with this function.

  Example:
    >>> c = load_config_file("experiments/tiny.py")
    >>> c.train.num_steps
    1000
  """
  path, sep, arg = os.fspath(spec).partition(":")
  if not os.path.isfile(path):
    raise ValueError(f"config file {path!r} does not exist")
  name = "andrea_jax_config_" + "".join(ch if ch.isalnum() else "_" for ch in os.path.abspath(path))
  module_spec = importlib.util.spec_from_file_location(name, path)
  module = importlib.util.module_from_spec(module_spec)
  module_spec.loader.exec_module(module)
  if not hasattr(module, "get_config"):
    raise ValueError(f"config file {path!r} defines no get_config()")
  return module.get_config(arg) if sep else module.get_config()
