"""Hub names without network: tokenizers ('hf:<repo>') and datasets fail at once, cached files load.

Each case runs in a fresh process, because huggingface_hub and datasets read the offline switches
and the endpoint when they are imported. The time limits are loose: these are error paths (the
libraries alone retry for tens of seconds), not benchmarks.
"""

import json
import os
import subprocess
import sys

import pytest

from andrea_jax.data import train_bpe
from tests.util import REPO

LIMIT_S = 10.0
PROBE = r"""
import json, sys, time
from andrea_jax.data import DataError, load_tokenizer, prepare
from andrea_jax.data.hub.datasets import HubSpec
out = {}
for case, call in [
    ("tokenizer", lambda: load_tokenizer(sys.argv[1])),
    ("dataset", lambda: prepare({"chat": HubSpec(sys.argv[2])}, load_tokenizer("bytes"),
                                sys.argv[3], progress=False)),
]:
  start = time.perf_counter()
  try:
    result = call()
    out[case] = {"ok": True, "name": getattr(result, "name", None),
                 "spec": getattr(result, "spec", None)}
  except DataError as e:
    out[case] = {"ok": False, "error": str(e)}
  out[case]["seconds"] = time.perf_counter() - start
print(json.dumps(out))
"""


def _probe(tmp_path, env, tokenizer="hf:gpt2", dataset="andrea-jax-test/no-such-dataset"):
  env = {**os.environ, "PYTHONPATH": REPO, "HF_HOME": str(tmp_path / "hf_home"), **env}
  for k in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
    if k not in env or env[k] == "":
      env.pop(k, None)
  proc = subprocess.run([sys.executable, "-c", PROBE, tokenizer, dataset, str(tmp_path / "out")],
                        env=env, cwd=REPO, capture_output=True, text=True, timeout=120,
                        check=False)
  assert proc.returncode == 0, proc.stderr[-3000:]
  return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_offline_mode_stops_at_once_naming_the_tokenizer_and_the_dataset(tmp_path):
  out = _probe(tmp_path, {"HF_HUB_OFFLINE": "1"})
  tok, ds = out["tokenizer"], out["dataset"]
  assert not tok["ok"] and tok["seconds"] < LIMIT_S
  assert "tokenizer 'hf:gpt2'" in tok["error"] and "offline mode is on" in tok["error"]
  assert "set the tokenizer to the path of a tokenizer.json" in tok["error"]
  assert not ds["ok"] and ds["seconds"] < LIMIT_S
  assert "cannot load dataset 'andrea-jax-test/no-such-dataset'" in ds["error"]


@pytest.mark.slow
def test_unreachable_hub_stops_at_once_without_retries(tmp_path):
  # Not offline, but nothing listens at the endpoint: huggingface_hub alone would retry with
  # back-offs for about 25 s (and longer on timeouts) before giving up.
  out = _probe(tmp_path, {"HF_HUB_OFFLINE": "", "HF_DATASETS_OFFLINE": "",
                          "TRANSFORMERS_OFFLINE": "", "HF_ENDPOINT": "http://127.0.0.1:9"})
  tok, ds = out["tokenizer"], out["dataset"]
  assert not tok["ok"] and tok["seconds"] < LIMIT_S, tok
  assert "tokenizer 'hf:gpt2': cannot reach the Hugging Face Hub" in tok["error"]
  assert not ds["ok"] and ds["seconds"] < LIMIT_S, ds
  assert "cannot reach the Hugging Face Hub" in ds["error"] and "HF_HUB_OFFLINE=1" in ds["error"]


@pytest.mark.slow
def test_a_cached_hub_tokenizer_loads_offline(tmp_path):
  # The Hugging Face cache layout: models--<owner>--<name>/refs/main names the snapshot.
  commit = "0123456789abcdef0123456789abcdef01234567"
  repo = tmp_path / "hf_home" / "hub" / "models--andrea-jax-test--tiny-bpe"
  snapshot = repo / "snapshots" / commit
  snapshot.mkdir(parents=True)
  (repo / "refs").mkdir()
  (repo / "refs" / "main").write_text(commit)
  local = train_bpe(["cached tokenizer text " * 20], 300, snapshot / "tokenizer.json")
  out = _probe(tmp_path, {"HF_HUB_OFFLINE": "1"}, tokenizer="hf:andrea-jax-test/tiny-bpe")
  tok = out["tokenizer"]
  assert tok["ok"], tok
  assert tok["name"] == "hf:andrea-jax-test/tiny-bpe"
  assert os.path.samefile(tok["spec"], local.spec)
