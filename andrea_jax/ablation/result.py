"""What an ablation returns: curves per variant, held-out losses, samples and their repetition.

:class:`AblationResult` holds host-side numpy arrays (``K`` variants, ``N`` steps, ``E``
evaluations, ``S`` sources) and the final parameters stacked ``[K, ...]``; :func:`collect` builds it
from what the training programs produced. Samples are generated from ``config.eval.prompts`` with
:func:`andrea_jax.generate.generate`, vmapped over the variants with the same key for every
variant (paired: the variants differ only by their weights), and scored with
:mod:`andrea_jax.repetition`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from andrea_jax import checks
from andrea_jax import repetition
from andrea_jax import train
from andrea_jax.generate import generate

PyTree = Any


class Timer:
  """Seconds spent compiling and running, accumulated over ``with timer.compiling():`` blocks."""

  def __init__(self):
    self.compile_seconds = 0.0
    self.run_seconds = 0.0

  @contextlib.contextmanager
  def compiling(self):
    t0 = time.perf_counter()
    yield
    self.compile_seconds += time.perf_counter() - t0

  @contextlib.contextmanager
  def running(self):
    t0 = time.perf_counter()
    yield
    self.run_seconds += time.perf_counter() - t0


@dataclasses.dataclass
class AblationResult:
  """The outcome of :func:`~andrea_jax.ablation.train_variants` (or ``loop_baseline``).

  Attributes:
    variants: the ``K`` resolved variants (every field set), in order.
    sources: the ``S`` source names (the order of every per-source axis).
    mixture: ``[N, S]`` weights each step's batch was drawn with.
    loss, grad_norm, lr: ``[K, N]`` training loss (nats/token), gradient norm, learning rate.
    skipped: ``[K]`` non-finite steps skipped.
    eval_steps: ``[E]`` steps after which the held-out loss was measured.
    eval_loss: ``[K, E, S]`` held-out loss per source (NaN for sources not in the mixture).
    eval_sources: the sources evaluated (those with weight > 0 at some step).
    params: final parameters, every leaf stacked ``[K, ...]``.
    samples: per variant, per prompt: ``{"prompt", "greedy", "sampled", "greedy_repetition",
      "sampled_repetition"}`` (empty without samples).
    compile_seconds, run_seconds: time compiling, and time running the steps and evaluations.
    method: ``"vmap"`` or ``"loop"``.
  """
  variants: list
  sources: tuple[str, ...]
  mixture: np.ndarray
  loss: np.ndarray
  grad_norm: np.ndarray
  lr: np.ndarray
  skipped: np.ndarray
  eval_steps: np.ndarray
  eval_loss: np.ndarray
  eval_sources: tuple[str, ...]
  params: PyTree
  samples: list[list[dict[str, Any]]]
  compile_seconds: float
  run_seconds: float
  method: str

  @property
  def seconds(self) -> float:
    """Compile plus run time."""
    return self.compile_seconds + self.run_seconds

  @property
  def labels(self) -> list[str]:
    return [v.label for v in self.variants]

  def variant_params(self, k: int) -> PyTree:
    """The final parameters of variant ``k`` (unstacked)."""
    return jax.tree.map(lambda x: x[k], self.params)

  def final_loss(self, last: int = 10) -> np.ndarray:
    """``[K]`` mean training loss over the last ``last`` steps (NaN-aware)."""
    last = checks.integer("final_loss: last", last, minimum=1)
    return np.nanmean(self.loss[:, -last:], axis=1)

  def final_eval_loss(self) -> np.ndarray:
    """``[K]`` held-out loss at the last evaluation, averaged over the evaluated sources."""
    idx = [self.sources.index(s) for s in self.eval_sources]
    return self.eval_loss[:, -1, idx].mean(axis=1)

  def repetition(self, mode: str = "greedy") -> np.ndarray:
    """``[K, P]`` repetition score of each variant's sample of each prompt (``"greedy"`` or
    ``"sampled"``); ``[K, 0]`` without samples."""
    return np.asarray([[s[f"{mode}_repetition"] for s in row] for row in self.samples],
                      np.float64).reshape(len(self.variants), -1)

  def collapsed(self, mode: str = "greedy", threshold: float = 0.5) -> np.ndarray:
    """``[K]`` number of prompts whose sample :func:`~andrea_jax.repetition.is_collapsed`."""
    return (self.repetition(mode) >= threshold).sum(axis=1)

  def table(self) -> str:
    """One plain-text line per variant: final train and held-out loss, repetition, collapses."""
    head = (f"{'variant':<44} {'train':>7} {'held-out':>8} {'greedy rep':>10} "
            f"{'sampled rep':>11} {'collapsed':>9}")
    rows = [head, "-" * len(head)]
    rep_g, rep_s, col = self.repetition("greedy"), self.repetition("sampled"), self.collapsed()
    for k, v in enumerate(self.variants):
      g = f"{rep_g[k].mean():.3f}" if rep_g.size else "-"
      s = f"{rep_s[k].mean():.3f}" if rep_s.size else "-"
      c = f"{col[k]}/{rep_g.shape[1]}" if rep_g.size else "-"
      rows.append(f"{v.label:<44} {self.final_loss()[k]:>7.3f} {self.final_eval_loss()[k]:>8.3f} "
                  f"{g:>10} {s:>11} {c:>9}")
    return "\n".join(rows)


def generate_samples(params_K: PyTree, model_config, tokenizer, prompts, key: jax.Array, *,
                     max_new_tokens: int, temperature: float, top_k: int | None
                     ) -> list[list[dict[str, Any]]]:
  """Greedy and sampled continuations of every prompt by every variant, with repetition scores.

  Prompt ``i`` uses ``fold_in(key, i)`` for every variant. The repetition score is taken over the
  new token ids (:func:`andrea_jax.repetition.repetition_score`), as the trainer's evaluation does.
  Returns ``[K][P]`` dicts.
  """
  k = jax.tree.leaves(params_K)[0].shape[0]
  out: list[list[dict[str, Any]]] = [[] for _ in range(k)]
  if not max_new_tokens:
    return out

  def gen(p, prompt_1xP, key, greedy):
    return generate(p, model_config, prompt_1xP, key, max_new_tokens=max_new_tokens,
                    temperature=temperature, top_k=top_k, greedy=greedy)

  many = jax.jit(jax.vmap(gen, in_axes=(0, None, None, None)), static_argnums=3)
  for i, text in enumerate(prompts):
    # Training documents start with the end-of-document id, so prompts do too.
    prompt = np.concatenate([[tokenizer.eod_id], tokenizer.encode(text)]).astype(np.int32)
    rows = [{"prompt": text} for _ in range(k)]
    for mode, greedy in (("greedy", True), ("sampled", False)):
      toks_KxT = np.asarray(many(params_K, jnp.asarray(prompt[None]), jax.random.fold_in(key, i),
                                 greedy))[:, 0]
      for j in range(k):
        new = toks_KxT[j, len(prompt):]
        rows[j][mode] = tokenizer.decode(new[new != tokenizer.eod_id].tolist())
        rows[j][f"{mode}_repetition"] = float(repetition.repetition_score(new))
    for j in range(k):
      out[j].append(rows[j])
  return out


def collect(run, data, variants, metrics, evals, params_K, skipped, timer: Timer, *, samples: bool,
            config, num_steps: int, method: str) -> AblationResult:
  """Gathers the chunks' metrics (each ``{name: [C, K]}``) and evaluations into a result."""
  m = jax.device_get(metrics)
  cat = lambda name: np.concatenate([np.asarray(c[name]) for c in m], axis=0).T   # [K, N]
  k, s = len(variants), len(run.sources)
  eval_loss = np.full((k, len(evals), s), np.nan)
  idx = [run.sources.index(n) for n in data.eval_sources]
  for e, (_, (loss_KxS, tokens_KxS)) in enumerate(jax.device_get(evals)):
    eval_loss[:, e, idx] = (np.asarray(loss_KxS) / np.maximum(np.asarray(tokens_KxS), 1.0))[:, idx]
  texts: list[list[dict[str, Any]]] = [[] for _ in variants]
  if samples:
    ecfg = config.eval
    texts = generate_samples(
        params_K, run.model, data.tokenizer, list(ecfg.prompts),
        jax.random.fold_in(train.run_keys(config.seed)["eval"], num_steps),
        max_new_tokens=ecfg.sample_tokens, temperature=ecfg.temperature, top_k=ecfg.top_k or None)
  return AblationResult(
      variants=list(variants), sources=tuple(run.sources), mixture=np.asarray(data.weights_NxS),
      loss=cat("loss"), grad_norm=cat("grad_norm"), lr=cat("lr"), skipped=np.asarray(skipped),
      eval_steps=np.asarray([st for st, _ in evals], np.int64), eval_loss=eval_loss,
      eval_sources=tuple(data.eval_sources), params=params_K, samples=texts,
      compile_seconds=timer.compile_seconds, run_seconds=timer.run_seconds, method=method)
