r"""lm-evaluation-harness on a trained model: the backend :class:`AndreaLM` and its command line.

  python -m andrea_jax.harness --workdir runs/tiny --tasks hellaswag --limit 200
  python -m andrea_jax.harness --hf runs/tiny-hf --tasks my_task --include_path my_tasks/ \
      --num_fewshot 0 --batch_size 16 --output runs/tiny-hf/lm_eval.json

(``andrea-eval`` is the same command; it needs ``pip install 'andrea_jax[eval]'``.) The model is a
run's checkpoint (``--workdir``, ``--step``) or a Hugging Face GPT-2 folder (``--hf``, e.g. what
``python -m andrea_jax.export`` wrote); ``--tasks`` are lm-evaluation-harness task names, those of
the task folders in ``--include_path`` among them (a local task reads its data with ``dataset_path:
json`` and ``dataset_kwargs: {data_files: {test: path}}``, a path relative to where the command
runs). It prints lm-eval's table and, with ``--output``, writes the results as JSON: lm-eval's
``results``, ``n-shot``, ``versions`` and ``n-samples``, the model's ``source`` and ``step``, and
``flat`` (``{"task/metric": value}``), with ``samples`` when ``--log_samples``.

:class:`AndreaLM` is a ``TemplateLM``: lm-eval's own code tokenises the requests (the space at a
context's end moved into the continuation, an empty context replaced by the end-of-document id,
as the ``hf`` backend does with the exported folder, whose BOS is that id), and this backend scores
them in float32 (:mod:`andrea_jax.scoring`: batches of ``batch_size`` rows in a few padded
lengths):

* ``loglikelihood`` -- ``log p(continuation | context)`` and whether it is the greedy one, the
  window cut to ``max_len + 1`` ids from the left;
* ``loglikelihood_rolling`` -- a document's log-likelihood in disjoint windows of ``max_len``
  ids, each conditioned on what precedes it in the window (``lm_eval.utils``'
  ``get_rolling_token_windows`` with the end-of-document id as the prefix);
* ``generate_until`` -- greedy continuations (the context left-cut to ``max_len - max_gen_toks``),
  stopped at the end-of-document id or the first ``until`` string, which is cut off. Sampling
  (``do_sample``, a temperature > 0) is refused.

On the exported folder it gives lm-eval's ``hf`` backend's numbers (the tests compare both on four
kinds of task), whatever ``batch_size`` is.

Example:
  >>> import lm_eval
  >>> lm_eval.simple_evaluate(model=AndreaLM.from_workdir("runs/tiny"), tasks=["hellaswag"],
  ...                         limit=100)["results"]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from typing import Any

try:
  import lm_eval.utils
  from lm_eval.api.model import TemplateLM
  from lm_eval.models import utils as lm_models_utils
except ImportError as e:   # an optional extra
  raise ImportError("the lm-evaluation-harness backend needs lm-eval: "
                    "pip install 'andrea_jax[eval]'") from e

from andrea_jax import checks
from andrea_jax import hf_files
from andrea_jax import scoring
from andrea_jax import trained

DEFAULT_MAX_GEN_TOKS = 256


class AndreaLM(TemplateLM):
  """A :class:`andrea_jax.trained.TrainedModel` as an lm-evaluation-harness model (see the module
  docstring); ``simple_evaluate(model=AndreaLM(...))`` takes it as it is.

  Args:
    model: the model (:func:`andrea_jax.trained.load`); scored in float32.
    batch_size: rows per program call.
    max_gen_toks: the generation length of tasks that do not set one.
  """

  def __init__(self, model: trained.TrainedModel, *, batch_size: int = 16,
               max_gen_toks: int = DEFAULT_MAX_GEN_TOKS):
    super().__init__()
    self.model = dataclasses.replace(model, config=dataclasses.replace(model.config,
                                                                       dtype="float32"))
    self._batch_size = int(batch_size)
    self._max_gen_toks = int(max_gen_toks)
    self._scorer = scoring.Scorer(self.model.params, self.model.config, self._batch_size)

  @classmethod
  def from_workdir(cls, workdir: str, step: int | None = None, **kw) -> "AndreaLM":
    """The model of a run's checkpoint (default: the newest)."""
    return cls(trained.from_workdir(workdir, step), **kw)

  @classmethod
  def from_hf(cls, folder: str, **kw) -> "AndreaLM":
    """The model of a Hugging Face GPT-2 folder (or ``hf:<repo>``)."""
    return cls(trained.from_hf(folder), **kw)

  @classmethod
  def create_from_arg_string(cls, arg_string: str, additional_config: dict | None = None
                             ) -> "AndreaLM":
    """``"workdir=runs/tiny,step=500"`` or ``"hf=runs/tiny-hf"`` (plus ``batch_size``,
    ``max_gen_toks``), as ``lm_eval``'s ``model_args`` name a model."""
    args = lm_eval.utils.simple_parse_args_string(arg_string)
    extra = {k: v for k, v in (additional_config or {}).items()
             if k in ("batch_size", "max_gen_toks") and v is not None}
    kw = {k: int(v) for k, v in {**args, **extra}.items() if k in ("batch_size", "max_gen_toks")}
    step = args.get("step")
    return cls(trained.load(args.get("workdir"), None if step is None else int(step),
                            args.get("hf")), **kw)

  @property
  def eot_token_id(self) -> int:
    return self.model.tokenizer.eod_id

  @property
  def max_length(self) -> int:
    return self.model.config.max_len

  @property
  def max_gen_toks(self) -> int:
    return self._max_gen_toks

  @property
  def batch_size(self) -> int:
    return self._batch_size

  @property
  def tokenizer_name(self) -> str:
    return self.model.tokenizer.name

  def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kw) -> list[int]:
    """The tokenizer's ids (no special token is ever added)."""
    return [int(i) for i in self.model.tokenizer.encode(string)]

  def tok_decode(self, ids: list[int]) -> str:
    """The text of ``ids``, the end-of-document id and ids the tokenizer lacks left out."""
    tok = self.model.tokenizer   # as HFLM's, special tokens skipped
    return tok.decode([i for i in ids if i < tok.vocab_size and i != tok.eod_id])

  def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, **kw
                            ) -> list[tuple[float, bool]]:
    """``(log-likelihood, is greedy)`` of each ``(key, context ids, continuation ids)``."""
    out = self._scorer.loglikelihoods([(ctx, cont) for _, ctx, cont in requests])
    for (key, _, _), answer in zip(requests, out):
      if key is not None:
        self.cache_hook.add_partial("loglikelihood", key, answer)
    return out

  def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
    """Each document's log-likelihood, summed over disjoint ``max_len`` windows."""
    windows, owner = [], []
    for r, (text,) in enumerate(req.args for req in requests):
      for w in lm_eval.utils.get_rolling_token_windows(
          token_list=self.tok_encode(text), prefix_token=self.prefix_token_id,
          max_seq_len=self.max_length, context_len=1):
        windows.append(lm_eval.utils.make_disjoint_window(w))
        owner.append(r)
    scores = self._scorer.loglikelihoods(windows)
    totals = [0.0] * len(requests)
    for r, (logp, _) in zip(owner, scores):
      totals[r] += logp
    for req, total in zip(requests, totals):
      self.cache_hook.add_partial("loglikelihood_rolling", req.args, total)
    return totals

  def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
    """Greedy continuations, grouped by generation settings, cut at the first ``until``."""
    results: list[str | None] = [None] * len(requests)
    groups: dict[str, list[int]] = {}
    for i, req in enumerate(requests):
      groups.setdefault(json.dumps(req.args[1], sort_keys=True, default=str), []).append(i)
    for indices in groups.values():
      kwargs = lm_models_utils.normalize_gen_kwargs(requests[indices[0]].args[1],
                                                    self.max_gen_toks)
      if kwargs.get("do_sample") or float(kwargs.get("temperature") or 0.0) > 0:
        raise ValueError(f"AndreaLM decodes greedily; a task asks for sampling ({kwargs})")
      until = lm_models_utils.handle_stop_sequences(kwargs.get("until"), eos=None)
      new = int(kwargs["max_gen_toks"])
      if not 0 < new < self.max_length:
        raise ValueError(f"max_gen_toks = {new} leaves no context in max_length "
                         f"{self.max_length}")
      contexts = [(self.tok_encode(requests[i].args[0]) or [self.prefix_token_id])
                  [-(self.max_length - new):] for i in indices]
      stop = (lambda ids: any(u and u in self.tok_decode(ids) for u in until)) if until else None
      for i, ids in zip(indices, self._scorer.greedy(contexts, new, self.eot_token_id, stop)):
        text = lm_models_utils.postprocess_generated_text(self.tok_decode(ids), until, None)
        results[i] = text
        self.cache_hook.add_partial("generate_until", requests[i].args, text)
    return results

  def chat_template(self, chat_template: bool | str = False) -> str | None:
    """The Jinja text of the model's chat template, when one is asked for."""
    if not chat_template or self.model.template_spec is None:
      return None
    return hf_files.chat_template_source(self.model.chat_template())

  def apply_chat_template(self, chat_history: list[dict[str, str]],
                          add_generation_prompt: bool = True) -> str:
    """The conversation in the model's chat template; without ``add_generation_prompt`` the last
    message is left open to be continued (``transformers``' ``continue_final_message``)."""
    from andrea_jax.data.hub.templates import render_chat
    text = render_chat(self.model.chat_template(), chat_history,
                       add_generation_prompt=add_generation_prompt)
    if add_generation_prompt:
      return text
    final = chat_history[-1]["content"]
    at = text.rindex(final.strip())
    keep = (len(final.lstrip()) if text[at:at + len(final.lstrip())] == final
            else len(final.strip()))
    return text[:at + keep]


def _register() -> None:
  """``"andrea"`` in lm-eval's model registry (``simple_evaluate(model="andrea",
  model_args="workdir=runs/tiny")``), its built-in models registered first (lm-eval fills the
  registry only when it is empty)."""
  from lm_eval.api import registry
  import lm_eval.models  # noqa: F401
  if "andrea" not in registry.model_registry.keys():
    registry.register_model("andrea")(AndreaLM)


_register()


def flat_results(results: dict[str, Any]) -> dict[str, float]:
  """``{"task/metric": value}`` of lm-eval's ``results`` (numbers only; ``",none"`` dropped).

  Example:
    >>> flat_results({"results": {"mc": {"acc,none": 0.25, "alias": "mc"}}})
    {'mc/acc': 0.25}
  """
  out = {}
  for task, metrics in results.get("results", {}).items():
    for name, value in metrics.items():
      if checks.is_number(value):
        out[f"{task}/{name.removesuffix(',none')}"] = float(value)
  return out


def evaluate(lm: AndreaLM, tasks: list[str], *, include_path: str | None = None,
             num_fewshot: int | None = None, limit: float | None = None,
             apply_chat_template: bool = False, log_samples: bool = False,
             bootstrap_iters: int = 1000, seed: int = 0) -> dict[str, Any]:
  """lm-eval's ``simple_evaluate`` of ``lm`` on ``tasks`` (``include_path``: a folder of task
  YAMLs besides lm-eval's own); returns its result dict."""
  from lm_eval import simple_evaluate
  from lm_eval.tasks import TaskManager
  manager = TaskManager(include_path=include_path)
  missing = [t for t in tasks if t not in manager.all_tasks]
  if missing:
    raise ValueError(f"--tasks: no lm-eval task named {missing}"
                     + (f" (nor in --include_path {include_path})" if include_path else "")
                     + "; lm_eval.tasks.TaskManager().all_tasks lists the known ones")
  return simple_evaluate(model=lm, tasks=tasks, num_fewshot=num_fewshot, limit=limit,
                         task_manager=manager, apply_chat_template=apply_chat_template,
                         log_samples=log_samples, bootstrap_iters=bootstrap_iters,
                         random_seed=seed, numpy_random_seed=seed, torch_random_seed=seed,
                         fewshot_random_seed=seed)


def parser() -> argparse.ArgumentParser:
  p = argparse.ArgumentParser(prog="python -m andrea_jax.harness",
                              description=__doc__.splitlines()[0])
  p.add_argument("--workdir", default=None, help="a run's directory (holds checkpoints/)")
  p.add_argument("--step", type=int, default=None, help="its checkpoint (default: the newest)")
  p.add_argument("--hf", default=None, help="a Hugging Face GPT-2 folder, or hf:<repo>")
  p.add_argument("--tasks", required=True, help="comma-separated lm-eval task names")
  p.add_argument("--include_path", default=None, help="a folder of task YAMLs of your own")
  p.add_argument("--num_fewshot", type=int, default=None, help="examples before each question")
  p.add_argument("--limit", type=float, default=None,
                 help="documents per task (a number < 1: that fraction of them)")
  p.add_argument("--batch_size", type=int, default=16, help="rows per program call")
  p.add_argument("--max_gen_toks", type=int, default=DEFAULT_MAX_GEN_TOKS,
                 help="generation length of tasks that set none")
  p.add_argument("--apply_chat_template", action="store_true",
                 help="wrap each request in the model's chat template")
  p.add_argument("--log_samples", action="store_true", help="each request's answer in --output")
  p.add_argument("--bootstrap_iters", type=int, default=1000,
                 help="bootstrap resamples of the standard errors (0: none)")
  p.add_argument("--seed", type=int, default=0, help="few-shot sampling and lm-eval's seeds")
  p.add_argument("--output", default=None, help="a JSON file for the results")
  return p


def main(argv: list[str] | None = None) -> int:
  """The command line; bad input ends with one ``error:`` line (exit status 1)."""
  args = parser().parse_args(argv)
  from andrea_jax.checkpoint import CheckpointError
  from andrea_jax.data import DataError
  from andrea_jax import storage
  tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
  limit = None if args.limit is None else (int(args.limit) if args.limit >= 1 else args.limit)
  try:
    checks.integer("--batch_size", args.batch_size, minimum=1)
    if args.include_path is not None and not os.path.isdir(args.include_path):
      raise ValueError(f"--include_path {args.include_path} is not a directory")
    lm = AndreaLM(trained.load(args.workdir, args.step, args.hf), batch_size=args.batch_size,
                  max_gen_toks=args.max_gen_toks)
    results = evaluate(lm, tasks, include_path=args.include_path, num_fewshot=args.num_fewshot,
                       limit=limit, apply_chat_template=args.apply_chat_template,
                       log_samples=args.log_samples, bootstrap_iters=args.bootstrap_iters,
                       seed=args.seed)
  except (ValueError, TypeError, OSError, DataError, CheckpointError) as e:
    print(f"error: {e}", file=sys.stderr)
    return 1
  print(f"{lm.model.origin}, step {lm.model.step}")
  print(lm_eval.utils.make_table(results))
  if args.output:
    keep = {k: results[k] for k in ("results", "n-shot", "versions", "n-samples") if k in results}
    report = {"source": lm.model.origin, "step": lm.model.step, **keep,
              "flat": flat_results(results)}
    if args.log_samples:
      report["samples"] = results.get("samples")
    os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
    storage.atomic_write(args.output, json.dumps(report, indent=2, default=(
        lm_eval.utils.handle_non_serializable)), "the results were not written")
    print(f"wrote {args.output}")
  return 0


def run() -> None:
  """Entry point of ``andrea-eval``."""
  sys.exit(main())


if __name__ == "__main__":
  run()
