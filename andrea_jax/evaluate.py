"""Evaluation during training: held-out loss per source (:class:`HeldOut`), and text samples with
their repetition (:class:`Samples`), each a metric ``(params, step) -> record`` that
:func:`evaluation` joins into one record.

Each evaluation record holds, for every source the run evaluates (those it samples and those of
``eval.untrained``, which the means below include), the held-out loss in nats per
token (``eval/loss/<source>``) and in bits per byte (``eval/bpb/<source>``, comparable across
tokenizers and with character-level results: :mod:`andrea_jax.data.bpb`), their equal-weight means
(``eval/mean_loss``, ``eval/mean_bpb``), the loss on the run's target mixture (``eval/target_loss``
and ``eval/target_bpb``, when ``eval.target`` names one), and greedy and sampled continuations of
fixed prompts with their repetition and, when the corpus has a vocabulary, the share of their words
that are words of the corpus (``eval/word_share``: :mod:`andrea_jax.data.corpora.wordshare`).

For a source whose loss counts only some tokens (a chat source's ``loss_on``), ``eval/loss`` and
``eval/bpb`` are over the tokens the loss counts, as training sees them, and the record also holds
the same over every token: ``eval/loss_all_tokens/<source>`` and ``eval/bpb_all_tokens/<source>``.

The held-out windows are fixed (the same at every evaluation and in every resumed run); the sampling
keys are ``fold_in(eval_key, step)``. So an evaluation record is a deterministic function of the
parameters and the step, and goes into ``metrics.jsonl`` with the training records.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from andrea_jax import checks
from andrea_jax import data as data_lib
from andrea_jax import repetition
from andrea_jax.data import bpb
from andrea_jax import sharding
from andrea_jax import step as step_lib
from andrea_jax.generate import generate


def eval_chunks(batch: dict[str, np.ndarray], chunk_rows: int) -> list[dict[str, np.ndarray]]:
  """``batch`` cut into chunks of ``chunk_rows`` rows, the last one padded with rows of segment id
  0 (tokens that do not count: :func:`andrea_jax.step.token_losses`).

  Example:
    >>> [c["inputs"].shape[0] for c in eval_chunks({"inputs": ..., ...}, 32)]  # 80 rows
    [32, 32, 32]
  """
  chunk_rows = checks.integer("eval_chunks: chunk_rows", chunk_rows, minimum=1)
  rows = len(batch["inputs"])
  pad = -rows % chunk_rows
  padded = {k: np.concatenate([v, np.zeros((pad,) + v.shape[1:], v.dtype)])
            for k, v in batch.items()}
  return [{k: v[i:i + chunk_rows] for k, v in padded.items()}
          for i in range(0, rows + pad, chunk_rows)]


def _check_counted(batch: dict[str, np.ndarray], sources: tuple[str, ...],
                   masked: list[str]) -> None:
  """``DataError`` naming a source with a loss mask whose held-out windows hold no token the loss
  counts (its held-out loss would be 0 / 0), before anything compiles."""
  if not masked:
    return
  counted_B = ((batch["segment_ids"] > 0) & (batch["loss_mask"] > 0)).sum(-1)
  for name in masked:
    if not counted_B[batch["source_ids"] == sources.index(name)].sum():
      raise data_lib.DataError(
          f"source {name!r}: its held-out windows hold no token its loss counts (loss_on "
          "leaves out every one of them): raise eval.sequences_per_source, or its "
          "eval_fraction and prepare it again")


class HeldOut:
  """Held-out loss per source, in nats per token and bits per byte, their means and the target's.

  The held-out rows go through the model in chunks no larger than one training micro-batch
  (``data.global_batch_size / optim.grad_accum_steps`` rows, the activations a training step
  already holds), each split over ``mesh``'s devices as a training batch is: the evaluation needs
  no more memory than training, and every device computes its share of the rows, not all of them.
  """

  def __init__(self, run, data, tokenizer, *, mesh: Mesh | None = None):
    """``run``: the :class:`andrea_jax.runconfig.Run`; its evaluated sources are read from
    ``data`` (``eval.sequences_per_source`` fixed windows each)."""
    self.run_ = run
    num_sources = len(run.sources)
    parts = []
    self.eval_sources = []
    for i, name in enumerate(run.sources):
      if name not in run.evaluated:
        continue
      b = data_lib.eval_batches(data, name, seq_len=run.data.seq_len,
                                num_sequences=run.eval.sequences_per_source)
      parts.append(dict(b, source_ids=np.full((b["inputs"].shape[0],), i, np.int32)))
      self.eval_sources.append(name)
    self.batch = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
    self.masked = [n for n in self.eval_sources if n in data.masked_sources]
    _check_counted(self.batch, run.sources, self.masked)
    # Bits per byte: each source's held-out tokens per byte, read once.
    self.tokens_per_byte = {n: bpb.heldout_tokens_per_byte(data, n, tokenizer,
                                                           counted=n in self.masked)
                            for n in self.eval_sources}
    self.all_tokens_per_byte = {n: bpb.heldout_tokens_per_byte(data, n, tokenizer)
                                for n in self.masked}
    devices = mesh.devices.size if mesh is not None else 1
    micro = run.data.micro_batch_size   # a multiple of the devices
    rows = len(self.batch["inputs"])
    # As few chunks as micro-batch-sized ones would need, as even as whole rows per device allow.
    num_chunks = -(-rows // micro)
    self.chunk_rows = -(-rows // (num_chunks * devices)) * devices
    chunks = eval_chunks(self.batch, self.chunk_rows)
    model, document_mask = run.step.model, run.step.document_mask   # training's attention
    # With masks, one forward pass gives the sums over the counted tokens and over every token.
    sums = step_lib.eval_losses_all_tokens if self.masked else step_lib.eval_losses
    losses = lambda p, b: sums(model, p, b, num_sources, document_mask)
    if mesh is None:
      self._chunks = chunks
      self._losses = jax.jit(losses)
    else:   # every process holds every held-out row: each device takes its slice of them
      self._chunks = [sharding.put_rows(c, sharding.batch_sharding(mesh)) for c in chunks]
      self._losses = jax.jit(losses, out_shardings=NamedSharding(mesh, P()))

  def losses(self, params) -> dict[str, float]:
    """Mean held-out loss (nats/token) of each source in use, over the tokens its loss counts."""
    return self.losses_and_all_tokens(params)[0]

  def losses_and_all_tokens(self, params) -> tuple[dict[str, float], dict[str, float]]:
    """:meth:`losses`, and the mean loss over every token of each source with a loss mask."""
    sums = None
    for chunk in self._chunks:
      out = self._losses(params, chunk)
      sums = out if sums is None else tuple(a + b for a, b in zip(sums, out))
    sums = jax.device_get(sums)
    idx = {n: i for i, n in enumerate(self.run_.sources)}
    mean = lambda loss_S, tokens_S, n: float(loss_S[idx[n]] / max(tokens_S[idx[n]], 1.0))
    losses = {n: mean(sums[0], sums[1], n) for n in self.eval_sources}
    return losses, {n: mean(sums[2], sums[3], n) for n in self.masked}

  def loss_record(self, losses: dict[str, float],
                  all_tokens: dict[str, float] | None = None) -> dict[str, float]:
    """The held-out part of a record, from each source's loss (nats/token): bits per byte, the
    equal-weight means and the target mixture's loss; with ``all_tokens`` (the masked sources'
    losses over every token), those and their bits per byte too."""
    bits = {n: bpb.bits_per_byte(v, self.tokens_per_byte[n]) for n, v in losses.items()}
    rec = {"eval/mean_loss": float(np.mean(list(losses.values()))),
           "eval/mean_bpb": float(np.mean(list(bits.values())))}
    rec.update({f"eval/loss/{n}": v for n, v in losses.items()})
    rec.update({f"eval/bpb/{n}": v for n, v in bits.items()})
    if self.run_.target is not None:
      w = dict(zip(self.run_.sources, self.run_.target))
      rec["eval/target_loss"] = float(sum(w[n] * v for n, v in losses.items()))
      rec["eval/target_bpb"] = float(sum(w[n] * v for n, v in bits.items()))
    for n, v in (all_tokens or {}).items():
      rec[f"eval/loss_all_tokens/{n}"] = v
      rec[f"eval/bpb_all_tokens/{n}"] = bpb.bits_per_byte(v, self.all_tokens_per_byte[n])
    return rec

  def record(self, params, step: int | None = None) -> dict[str, float]:
    """The held-out part of an evaluation record (``step`` is not read: the losses are a
    function of the parameters alone)."""
    return self.loss_record(*self.losses_and_all_tokens(params))


class Samples:
  """Greedy and sampled continuations of fixed prompts (``eval.prompts``), with their repetition
  and, when the corpus has a vocabulary, the share of their words that are corpus words."""

  def __init__(self, run, tokenizer, key: jax.Array, samples_path: str | None = None, *,
               vocabulary: frozenset[str] | None = None):
    """``key``: the run's evaluation key (each step's draws are ``fold_in(key, step)``);
    ``samples_path``: where each evaluation's block is appended (``None``: nowhere)."""
    self.cfg, self.tokenizer, self.key = run.eval, tokenizer, key
    self.samples_path, self.vocabulary = samples_path, vocabulary
    # Training documents start with the end-of-document id, so prompts do too.
    self.prompts = [np.concatenate([[tokenizer.eod_id], tokenizer.encode(p)]).astype(np.int32)
                    for p in self.cfg.prompts]
    mcfg = run.model
    top_k = self.cfg.top_k or None
    # A model vocabulary larger than the tokenizer's (unused rows) must not emit undecodable ids.
    limit = min(tokenizer.vocab_size, mcfg.vocab_size)
    # One program per prompt: its greedy continuation (row 0) and its sampled one (row 1).
    self._generate = jax.jit(
        lambda p, prompt_1xP, key: generate(
            p, mcfg, jnp.concatenate([prompt_1xP, prompt_1xP]), key,
            max_new_tokens=self.cfg.sample_tokens, temperature=self.cfg.temperature, top_k=top_k,
            greedy=(True, False), vocab_limit=limit))

  def samples(self, params, step: int) -> list[dict[str, Any]]:
    """Greedy and sampled continuations of each prompt, with their repetition scores."""
    if not self.cfg.sample_tokens:
      return []
    out = []
    key = jax.random.fold_in(self.key, step)
    for i, (text, prompt) in enumerate(zip(self.cfg.prompts, self.prompts)):
      row = {"prompt": text}
      toks = np.asarray(self._generate(params, jnp.asarray(prompt[None]),
                                       jax.random.fold_in(key, i)))
      for r, mode in enumerate(("greedy", "sampled")):
        new = toks[r, len(prompt):]
        row[mode] = self.tokenizer.decode(new[new != self.tokenizer.eod_id].tolist())
        row[f"{mode}_repetition"] = float(repetition.repetition_score(new))
      out.append(row)
    return out

  def record(self, params, step: int) -> dict[str, Any]:
    """The samples' part of an evaluation record (and a block appended to ``samples.txt``):
    ``eval/repetition``, ``eval/greedy_repetition``, ``eval/word_share`` and ``samples``; empty
    when ``eval.sample_tokens`` is 0."""
    samples = self.samples(params, step)
    if not samples:
      return {}
    rec: dict[str, Any] = {
        "eval/repetition": float(np.mean([s["sampled_repetition"] for s in samples])),
        "eval/greedy_repetition": float(np.mean([s["greedy_repetition"] for s in samples]))}
    if self.vocabulary is not None:
      texts = [s[mode] for s in samples for mode in ("greedy", "sampled")]
      from andrea_jax.data.corpora import wordshare   # a corpus that knows its words
      rec["eval/word_share"] = wordshare.word_share(texts, self.vocabulary)
    rec["samples"] = samples
    if self.samples_path and jax.process_index() == 0:
      with open(self.samples_path, "a") as f:
        f.write(f"=== step {step} ===\n")
        for s in samples:
          f.write(f"[{s['prompt']!r}] greedy : {s['greedy']!r}\n")
          f.write(f"[{s['prompt']!r}] sampled: {s['sampled']!r}\n")
    return rec


class EvalContext(NamedTuple):
  """What a metric of one's own (``eval.metrics``) is built from: ``factory(ctx)`` returns
  ``metric(params, step) -> {key: number}``, joined into each evaluation record.

  Attributes:
    run: the :class:`andrea_jax.runconfig.Run`.
    data: the opened :class:`andrea_jax.data.PreparedData` (its held-out split too).
    tokenizer: the run's tokenizer.
    held_out: the run's :class:`HeldOut` (its fixed windows, ``losses(params)``).

  Example (``mymetrics.py``, ``eval.metrics = "mymetrics:perplexity"``)::

    def perplexity(ctx):
      def metric(params, step):
        return {f"eval/ppl/{s}": math.exp(v) for s, v in ctx.held_out.losses(params).items()}
      return metric
  """
  run: Any
  data: Any
  tokenizer: Any
  held_out: HeldOut


def evaluation(*metrics: Callable[[Any, int], dict[str, Any]]) -> Callable[[Any, int], dict]:
  """One evaluation record from metrics, each a function ``(params, step) -> {key: value}``
  (:meth:`HeldOut.record`, :meth:`Samples.record`, or one's own): ``{"step": step, ...}``.

  Example:
    >>> evaluate = evaluation(HeldOut(run, data, tok).record, Samples(run, tok, key).record)
    >>> evaluate(state.params, 250)["eval/mean_loss"]
  """
  def evaluate(params, step: int) -> dict[str, Any]:
    rec: dict[str, Any] = {"step": step}
    for metric in metrics:
      rec.update(metric(params, step))
    return rec
  return evaluate
