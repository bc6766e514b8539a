"""The README's "your own training loop" (``runconfig.build``, ``data.MixtureSampler``,
``train.init_state``, ``step.jit_step``), run as printed there, is the same run as
``train.train_and_evaluate``: the same losses and mixtures, worked out by the two loops
independently (one reads the curriculum's schedule after every step; the other through the
prefetching feed, a decision lag ahead)."""

import ast

import numpy as np
import pytest

from andrea_jax import logs, runconfig, train
from tests.util import REPO, small_run_config

# The README's config lines, replaced by the test's small config, and its print cadence, made every
# step; the rest runs as printed.
README_CONFIG = 'cfg = load_config_file("experiments/tiny.py")\ncfg.train.num_steps = 100\n'
README_CADENCE = "if t % 20 == 0:"


def readme_loop() -> str:
  text = (REPO / "README.md").read_text()
  at = text.index("```python\n", text.index("## The trainer as a loop you can copy"))
  code = text[at + len("```python\n"):]
  return code[:code.index("```")]


@pytest.mark.slow
def test_the_readme_loop_is_the_same_run_as_train_and_evaluate(tmp_path, data_cache, capsys,
                                                               monkeypatch):
  cfg = small_run_config(num_steps=30)   # crosses all three regimes: the mixture moves
  cfg.train.log_every = 1
  code = readme_loop()
  assert README_CONFIG in code and README_CADENCE in code
  monkeypatch.chdir(REPO)                # the README loads experiments/tiny.py by relative path
  namespace = {"__name__": "readme", "small": cfg}
  exec(code.replace(README_CONFIG, "cfg = small\n").replace(README_CADENCE, "if True:"), namespace)
  printed = {}
  for line in capsys.readouterr().out.splitlines():
    t, loss, mixture = line.split(" ", 2)
    printed[int(t)] = (float(loss), ast.literal_eval(mixture))
  assert sorted(printed) == list(range(30))

  train.train_and_evaluate(cfg, str(tmp_path))
  records = {r["step"]: r for r in logs.read_jsonl(str(tmp_path / "metrics.jsonl"))
             if "loss" in r}
  sources = runconfig.build(cfg).sources
  for t, (loss, mixture) in printed.items():
    np.testing.assert_allclose(loss, records[t]["loss"], rtol=1e-5, err_msg=f"step {t}")
    expect = {s: round(records[t][f"weight/{s}"], 3) for s in sources
              if records[t][f"weight/{s}"]}
    assert mixture == pytest.approx(expect, abs=1e-3), t
  assert len({str(m) for _, m in printed.values()}) >= 3    # the phases of three regimes
  # The loop's last step and state.
  np.testing.assert_allclose(float(namespace["metrics"]["loss"]), records[29]["loss"], rtol=1e-5)
  assert int(namespace["state"].step) == 30
