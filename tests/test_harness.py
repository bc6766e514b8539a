"""The lm-evaluation-harness backend against lm-eval's own ``hf`` backend on the exported folder:
four kinds of local task (multiple choice, a multi-token log-likelihood, rolling perplexity over
documents longer than the context, generation until a stop string) give identical accuracies and
generations and per-request log-likelihoods within 1e-4; ours do not depend on the batch size; and
the scorer's indexing is checked by hand."""

import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from andrea_jax import export
from andrea_jax import model as m
from andrea_jax import scoring
from tests import hf_util
from tests.util import REPO

lm_eval = pytest.importorskip("lm_eval")
harness = pytest.importorskip("andrea_jax.harness")

WORDS = "sun rain wind snow cloud storm fog hail ice mist dew frost gale haze".split()


def test_the_backend_is_registered_beside_lm_evals_own():
  from lm_eval.api import registry
  assert registry.get_model("andrea") is harness.AndreaLM
  assert registry.get_model("hf").__name__ == "HFLM"


def test_bucket_lengths():
  assert scoring.bucket_lengths(64) == [16, 32, 64]
  assert scoring.bucket_lengths(100) == [16, 32, 64, 100]
  assert scoring.bucket_lengths(8) == [8]
  assert [scoring.bucket(n, 100) for n in (1, 16, 17, 65, 100)] == [16, 16, 32, 100, 100]


def test_the_scorer_indexes_as_the_guide_draws_it():
  """``log p(k0 k1 | c0)`` by hand: the logits at c0 score k0, those at k0 score k1; a request
  longer than the context keeps its last max_len + 1 ids."""
  params = hf_util.random_params(std=0.3)
  cfg = hf_util.CFG
  scorer = scoring.Scorer(params, cfg, batch_size=2)

  def by_hand(ids):
    ids = ids[-(cfg.max_len + 1):]
    logits = np.asarray(m.Transformer(cfg).apply({"params": params}, np.array([ids[:-1]])),
                        np.float64)[0]
    logp = logits - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1,
                                                                              keepdims=True))
    logp -= logits.max(-1, keepdims=True)
    return logp, logits

  logp, logits = by_hand([5, 17, 42])
  want = logp[0, 17] + logp[1, 42]
  greedy = logits[0].argmax() == 17 and logits[1].argmax() == 42
  long_ctx = list(np.random.default_rng(1).integers(0, 257, size=80))
  logp2, _ = by_hand(long_ctx + [7, 8])
  want2 = logp2[-2, 7] + logp2[-1, 8]
  (got, is_greedy), (got2, _) = scorer.loglikelihoods([([5], [17, 42]), (long_ctx, [7, 8])])
  assert got == pytest.approx(want, abs=1e-4) and is_greedy == greedy
  assert got2 == pytest.approx(want2, abs=1e-4)
  with pytest.raises(ValueError, match="request 0: the context needs >= 1 id"):
    scorer.loglikelihoods([([], [1])])


def test_the_scorer_does_not_depend_on_the_batch_size():
  params = hf_util.random_params(std=0.3)
  rng = np.random.default_rng(0)
  requests = [(list(rng.integers(0, 257, size=rng.integers(1, 70))),
               list(rng.integers(0, 257, size=rng.integers(1, 8)))) for _ in range(11)]
  contexts = [list(rng.integers(0, 257, size=rng.integers(1, 40))) for _ in range(5)]
  results = []
  for batch_size in (1, 4):
    scorer = scoring.Scorer(params, hf_util.CFG, batch_size)
    results.append((scorer.loglikelihoods(requests), scorer.greedy(contexts, 12, 256)))
  (a, ga), (b, gb) = results
  assert ga == gb and [x[1] for x in a] == [x[1] for x in b]
  np.testing.assert_allclose([x[0] for x in a], [x[0] for x in b], atol=1e-5)


def test_the_scorers_batch_size_and_the_flat_results_keep_to_numbers():
  params = hf_util.random_params(std=0.3)
  with pytest.raises(ValueError, match="Scorer: batch_size must be >= 1, got 0"):
    scoring.Scorer(params, hf_util.CFG, 0)
  with pytest.raises(TypeError, match="Scorer: batch_size must be an integer, got True"):
    scoring.Scorer(params, hf_util.CFG, True)
  assert scoring.Scorer(params, hf_util.CFG, np.int64(3)).batch_size == 3
  results = {"results": {"mc": {"acc,none": 0.25, "n,none": 3, "flag,none": True,
                                "alias": "mc", "f32,none": np.float32(0.5)}}}
  assert harness.flat_results(results) == {"mc/acc": 0.25, "mc/n": 3.0, "mc/f32": 0.5}


def _task(folder, name, output_type, rows, **fields) -> None:
  """A local lm-eval task: its rows as JSON, its YAML naming them by absolute path."""
  data = os.path.join(folder, f"{name}.json")
  with open(data, "w") as f:
    json.dump(rows, f)
  lines = [f"task: {name}", "dataset_path: json", "dataset_kwargs:", "  data_files:",
           f"    test: {data}", "test_split: test", f"output_type: {output_type}"]
  lines += [f"{k}: {json.dumps(v)}" for k, v in fields.items()]
  with open(os.path.join(folder, f"{name}.yaml"), "w") as f:
    f.write("\n".join(lines) + "\n")


def _tasks(folder, until: str) -> list[str]:
  rng = np.random.default_rng(0)
  pick = lambda k: " ".join(rng.choice(WORDS, k))
  _task(folder, "toy_mc", "multiple_choice",
        [{"q": f"Which follows {w}? ", "choices": list(rng.choice(WORDS, 4)), "answer": i % 4}
         for i, w in enumerate(WORDS)],
        doc_to_text="{{q}}", doc_to_choice="{{choices}}", doc_to_target="answer",
        metric_list=[{"metric": "acc"}, {"metric": "acc_norm"}])
  # Multi-token continuations; an empty context (the prefix token), a context ending in a space
  # (moved into the continuation), text long enough to be cut from the left, non-ASCII text.
  contexts = ["", "The weather: ", "déjà vu — " + pick(20), "漢字 " + pick(2), pick(3)]
  _task(folder, "toy_ll", "loglikelihood",
        [{"context": contexts[i % 5], "target": " " + pick(2)} for i in range(10)],
        doc_to_text="{{context}}", doc_to_target="{{target}}",
        metric_list=[{"metric": "perplexity"}, {"metric": "acc"}])
  _task(folder, "toy_roll", "loglikelihood_rolling",
        [{"text": pick(40) + " é 漢字 😀\n" + pick(10)} for _ in range(4)],
        doc_to_text="", doc_to_target="{{text}}",
        metric_list=[{"metric": m} for m in ("word_perplexity", "byte_perplexity",
                                              "bits_per_byte")])
  _task(folder, "toy_gen", "generate_until",
        [{"q": f"Q: {pick(1 + 6 * (i % 3))}\nA:", "a": " " + pick(1)} for i in range(6)],
        doc_to_text="{{q}}", doc_to_target="{{a}}",
        generation_kwargs={"until": [until], "max_gen_toks": 12, "do_sample": False},
        metric_list=[{"metric": "exact_match"}])
  return ["toy_mc", "toy_ll", "toy_roll", "toy_gen"]


def _evaluate(model, tasks, folder, **kw):
  from lm_eval.tasks import TaskManager
  return lm_eval.simple_evaluate(model=model, tasks=tasks, bootstrap_iters=0, log_samples=True,
                                 task_manager=TaskManager(include_path=folder,
                                                          include_defaults=False), **kw)


def _responses(result, task):
  return [(s["doc_id"], s["resps"]) for s in result["samples"][task]]


def _same_responses(a, b, task, atol):
  """Each request's answer alike: the same generations, the same greedy flags, log-likelihoods
  within ``atol``."""
  ra, rb = _responses(a, task), _responses(b, task)
  assert [d for d, _ in ra] == [d for d, _ in rb]
  for (_, xs), (_, ys) in zip(ra, rb):
    assert len(xs) == len(ys)
    for x, y in zip(xs, ys):
      x, y = x[0], y[0]          # each request's one answer
      if isinstance(x, str):
        assert x == y, task                                                    # a generation
      elif isinstance(x, (tuple, list)):
        assert x[0] == pytest.approx(y[0], abs=atol) and x[1] == y[1], task   # (logp, greedy)
      else:
        assert x == pytest.approx(y, abs=atol), task                           # rolling


@pytest.mark.slow
def test_our_backend_gives_the_hf_backends_numbers_on_the_exported_folder(tmp_path):
  out = str(tmp_path / "hf")
  export.write_folder(hf_util.model(hf_util.random_params(std=0.3, seed=3), template="chatml"),
                      out)
  ours_lm = harness.AndreaLM.from_hf(out, batch_size=7)
  # A stop string the model does emit (a random model's favourite byte), so `until` is exercised.
  probe = ours_lm._scorer.greedy([[256, 81, 58]], 12, 256)[0]
  until = chr(np.bincount(probe).argmax())
  folder = str(tmp_path / "tasks")
  os.makedirs(folder)
  tasks = _tasks(folder, until)
  ours = _evaluate(ours_lm, tasks, folder)
  ref = _evaluate("hf", tasks, folder, model_args=f"pretrained={out},dtype=float32,device=cpu",
                  batch_size=1)
  for task in tasks:
    _same_responses(ours, ref, task, atol=1e-4)
    for metric, value in ours["results"][task].items():
      if "stderr" in metric:
        continue
      if metric.endswith("perplexity,none") or metric.startswith("bits_per_byte"):
        assert value == pytest.approx(ref["results"][task][metric], rel=1e-5), metric
      elif metric.split(",")[0] in ("acc", "acc_norm", "exact_match"):
        assert value == ref["results"][task][metric], metric
  gens = [r for _, r in _responses(ours, "toy_gen")]
  assert any(len(g[0][0]) < 12 for g in gens) and any(g[0][0] for g in gens)   # stopped, not empty
  # The batch size changes nothing: accuracies and generations identical, log-likelihoods to
  # float32 rounding (a matmul's rounding depends on its row count).
  again = _evaluate(harness.AndreaLM.from_hf(out, batch_size=1), tasks, folder)
  for task in tasks:
    _same_responses(ours, again, task, atol=1e-4)
    assert {k: v for k, v in ours["results"][task].items() if "acc" in k or "match" in k} == {
        k: v for k, v in again["results"][task].items() if "acc" in k or "match" in k}
  # The chat template as lm-eval's hf backend applies it (a conversation continued or answered).
  from lm_eval.models.huggingface import HFLM
  hflm = HFLM(pretrained=out, dtype="float32", device="cpu", batch_size=1)
  chat = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello there "}]
  for prompt in (True, False):
    history = chat[:1] if prompt else chat
    assert ours_lm.apply_chat_template(history, prompt) == hflm.apply_chat_template(history,
                                                                                    prompt)
  assert (ours_lm.prefix_token_id, ours_lm.max_length) == (hflm.prefix_token_id, hflm.max_length)


@pytest.mark.slow
def test_the_command_line_scores_local_tasks_offline(tmp_path):
  out = str(tmp_path / "hf")
  export.write_folder(hf_util.model(), out)
  folder = str(tmp_path / "tasks")
  os.makedirs(folder)
  _tasks(folder, "\n")
  cmd = [sys.executable, "-m", "andrea_jax.harness", "--hf", out, "--include_path", folder,
         "--batch_size", "4"]
  env = dict(os.environ, **hf_util.OFFLINE)
  go = lambda *a: subprocess.run(cmd + list(a), cwd=REPO, capture_output=True, text=True,
                                 env=env, timeout=600)
  result = go("--tasks", "toy_mc,toy_roll", "--output", str(tmp_path / "r" / "lm_eval.json"),
              "--limit", "3", "--log_samples")
  assert result.returncode == 0, result.stderr[-3000:]
  assert "toy_mc" in result.stdout and "toy_roll" in result.stdout and "|acc" in result.stdout
  report = json.loads((tmp_path / "r" / "lm_eval.json").read_text())
  assert set(report["flat"]) >= {"toy_mc/acc", "toy_mc/acc_norm", "toy_roll/bits_per_byte"}
  assert report["step"] == 7 and report["source"] == out and len(report["samples"]["toy_mc"]) == 3
  bad = go("--tasks", "toy_nope")
  assert bad.returncode == 1 and bad.stderr.startswith("error: --tasks: no lm-eval task named "
                                                       "['toy_nope']"), bad.stderr[-2000:]
