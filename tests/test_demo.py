"""``make demo``: the Makefile's command, which the README shows, run at the demo's own sizes
(model, batch, data, evaluation) and cut short; then the README's sampling block on its
checkpoint."""

import json
import re
import shlex
import subprocess
import sys

import pytest

from tests.test_docs import _blocks, _environment, _workspace, run_documented
from tests.util import REPO


def _demo_command() -> list[str]:
  """What ``make demo`` runs (the Makefile's recipe, its variables' defaults filled in)."""
  text = (REPO / "Makefile").read_text()
  default = lambda name: re.search(rf"^{name}\s*\?=\s*(\S+)", text, re.M).group(1)
  recipe = re.search(r"^demo:.*\n\t(.*)", text, re.M).group(1)
  recipe = recipe.replace("$(PY)", "python").replace(" $(ARGS)", "")
  for name in ("CONFIG", "WORKDIR"):
    recipe = recipe.replace(f"$({name})", default(name))
  return shlex.split(recipe)


def readme_sampling() -> str:
  text = (REPO / "README.md").read_text()
  code = next(b for b in _blocks(text, "python") if "load_checkpoint" in b)
  return code


# The demo runs through ANDREA's warmup geometry here (the whole run takes minutes on a laptop, too
# long for the suite), and evaluates where it stops: held-out losses, samples, the figure.
DEMO_STEPS = 100


@pytest.mark.slow
def test_the_demo_trains_and_its_checkpoint_samples(tmp_path, data_cache):
  """``make demo``'s command, as the README says it runs, through the warmup geometry; then the
  README's sampling block on its checkpoint. The held-out loss is well under the 8 bits per byte
  of a uniform guess over bytes, and every file the README lists is written."""
  words = _demo_command()
  assert words == ["python", "-m", "andrea_jax.main", "--config=experiments/tiny.py",
                   "--workdir=runs/tiny"]
  readme = (REPO / "README.md").read_text()
  assert f"`make demo` runs `{shlex.join(words)}`" in readme
  work = _workspace(tmp_path)
  env = _environment(work)
  log = run_documented(shlex.join(words), work, extra=(f"--config.train.stop_step={DEMO_STEPS}",),
                       env=env, raw=True, steps=False)
  assert f"stopped at train.stop_step: {DEMO_STEPS} steps, held-out mean loss" in log, log[-3000:]
  run = work / "runs" / "tiny"
  for name in ("metrics.jsonl", "throughput.jsonl", "samples.txt", "summary.png", "config.json"):
    assert (run / name).stat().st_size > 0, name
  assert any((run / "tensorboard").iterdir())
  assert (run / "checkpoints" / str(DEMO_STEPS)).is_dir()
  evals = [r for r in map(json.loads, (run / "metrics.jsonl").open()) if "eval/mean_bpb" in r]
  assert evals and evals[-1]["step"] == DEMO_STEPS
  assert 0 < evals[-1]["eval/mean_bpb"] < 5.0   # uniform over bytes: 8 bits per byte
  assert 0 <= evals[-1]["eval/word_share"] <= 1
  # The README's sampling block, run in the workdir's parent as a user would.
  code = readme_sampling()
  out = subprocess.run([sys.executable, "-c", code], cwd=work, env=env, capture_output=True,
                       text=True, timeout=600)
  assert out.returncode == 0, out.stderr[-3000:]
  assert len(out.stdout.strip()) > 10, out.stdout
