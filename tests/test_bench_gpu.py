"""The GPU benchmarks kept working without a GPU: bench/gpu.py (its rows and its parts) and
bench/torch_gpt2.py (both yardsticks) in their CPU modes give every row a figure, the prepared GPU
check (bench/device_check.py) runs end to end in its dry mode, writes what the device tool can
bring back and prints its verdicts first, and the verdicts are the targets' arithmetic."""

import ast
import json
import math
import os
import re
import subprocess
import sys
import time
import zipfile

import pytest

from andrea_jax import runconfig
from bench import curriculum_gpu
from bench import device_check
from bench import device_summary
from bench import gpu
from bench import gpu_parts
from bench import gpu_step
from tests.util import REPO

# An untrained model on uniformly random tokens: the loss is near ln(vocabulary) = ln 257.
LN_VOCAB = math.log(257)


def _row(name: str, **result) -> dict:
  return dict(gpu.ROWS[name], name=name, result=result)


@pytest.mark.slow
def test_gpu_bench_cpu_quick_gives_every_row_a_figure(tmp_path):
  # As a new user types it: by path, from the repository root.
  out = subprocess.run([sys.executable, "bench/gpu.py", "--cpu", "--quick",
                        f"--json={tmp_path / 'gpu.json'}"], cwd=REPO, capture_output=True,
                       text=True, timeout=1200)
  assert out.returncode == 0, out.stderr[-3000:]
  table = out.stdout[out.stdout.index("\nrow "):]
  for name in gpu.QUICK_ROWS:
    line = next(line for line in table.splitlines() if line.startswith(gpu.ROWS[name]["label"]))
    assert re.match(r"\s+[\d,]+ ", line[38:]), line        # tokens/s, not "failed"/"skipped"
  data = json.load(open(tmp_path / "gpu.json"))
  assert [row["name"] for row in data["rows"]] == list(gpu.QUICK_ROWS)
  for row in data["rows"]:
    r = row["result"]
    assert r["tokens_per_s"] > 0 and abs(r["loss"] - LN_VOCAB) < 0.3, (row["name"], r)
  assert data["verdicts"]["best"] in ("cudnn", "levers-off")
  assert "PASS" in out.stdout or "FAIL" in out.stdout
  assert data["levers"]["cudnn"]["alone"] is not None     # every lever over none


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["compiled-loss", "eager-loss"])
def test_torch_yardstick_cpu_mode_prints_its_table(variant):
  out = subprocess.run([sys.executable, "-m", "bench.torch_gpt2", "--cpu", "--quick",
                        f"--variant={variant}"], cwd=REPO, capture_output=True, text=True,
                       timeout=600)
  assert out.returncode == 0, out.stderr[-3000:]
  line = out.stdout.splitlines()[-1].split()
  assert line[0] == "tiny" and float(line[1].replace(",", "")) > 0, out.stdout
  compiled = "model and loss" if variant == "compiled-loss" else "loss eager"
  assert compiled in out.stdout or "eager (compile failed" in out.stdout, out.stdout


@pytest.mark.slow
def test_device_check_dry_run_end_to_end(tmp_path, data_cache):
  out_dir = tmp_path / "out"
  env = dict(os.environ, PYTHON=sys.executable)
  env.pop("OUT", None)
  # No carried wheels (a fresh clone): the dry run installs the package with the setuptools at hand.
  out = subprocess.run(["bash", "bench/device_check.sh", "--dry", f"--out={out_dir}",
                        f"--wheels={tmp_path / 'no_wheels'}"], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=3000)
  assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
  # What the device tool brings back: at most 8 files, no folder, plain names, under 16 MiB each.
  files = sorted(os.listdir(out_dir))
  assert files == sorted(device_check.OUTPUTS) == [
      "bench_gpu.txt", "check.log", "curriculum_gpu.txt", "hlo.zip", "results.json", "tests.txt"]
  assert all(os.path.getsize(out_dir / f) < 16 * 2**20 for f in files)
  results = json.load(open(out_dir / "results.json"))
  stages = results["stages"]
  assert list(stages) == list(device_check.STAGES)
  assert {name: s["status"] for name, s in stages.items()} == {
      name: "ok" for name in device_check.STAGES}, {n: s["figures"] for n, s in stages.items()}
  assert stages["install"]["figures"]["imported_from"].startswith(
      stages["install"]["figures"]["site"])
  accepted = results["env"]["flag_sets_accepted"]
  more = [r for r in device_check.MORE_ROWS
          if not r.startswith("flag-") or accepted[gpu.ROWS[r]["flags"]]]
  rows = stages["bench"]["figures"]["rows"] + stages["bench_more"]["figures"]["rows"]
  assert [row["name"] for row in rows] == list(device_check.BENCH_ROWS) + more
  for row in rows:
    assert row["result"]["tokens_per_s"] > 0 and abs(row["result"]["loss"] - LN_VOCAB) < 0.3
  parts = stages["parts"]["figures"]["parts"]
  assert all(parts[p][form]["ms"] > 0 for p in gpu_parts.PARTS for form in ("earlier", "now"))
  runs = stages["curriculum"]["figures"]["runs"]
  for strategy in ("andrea", "static"):
    assert len(runs[strategy]["step_s"]) == 3 and runs[strategy]["last_step"] == 19
  assert stages["tests"]["figures"].get("failed", 0) == 0
  verdicts = results["verdicts"]
  assert set(verdicts) >= {"tokens_per_s", "mfu", "vs_torch", "levers", "curriculum_overhead",
                           "host_pipeline_overhead", "gpu_tests", "step_rest_ms"}
  assert verdicts["mfu"]["value"] is None      # a CPU has no peak: no MFU
  # Every JAX row and part has its optimized HLO in the zip.
  with zipfile.ZipFile(out_dir / "hlo.zip") as z:
    names = set(z.namelist())
  jax_rows = [row["name"] for row in rows if row["kind"] == "jax"]
  assert {f"{name}.hlo.txt" for name in jax_rows} <= names and len(names) == len(jax_rows) + 6
  # The console: the verdicts first (the targets, then the levers, then the curriculum), the
  # stages' own output only in check.log.
  console = out.stdout.splitlines()
  assert console[0].startswith("verdicts"), console[:3]
  order = [next(i for i, line in enumerate(console) if key in line)
           for key in ("tokens/s  -- target", "levers, tokens/s", "curriculum overhead")]
  assert order == sorted(order)
  assert "$ " not in out.stdout and "not finished" not in out.stdout
  log = (out_dir / "check.log").read_text()
  assert "curriculum overhead" in log and "tokens/s" in log
  assert "pytorch yardstick" in (out_dir / "bench_gpu.txt").read_text()


def test_rows_share_a_process_when_their_flags_agree_and_on_the_cpu_always():
  names = ["torch", "cudnn", "levers-off", "flag-cublaslt", "cudnn-default", "xla"]
  on = lambda cpu: [dict(gpu.ROWS[n], name=n, cpu=cpu) for n in names]
  as_names = lambda gs: [[r["name"] for r in g] for g in gs]
  assert as_names(gpu.groups(on(cpu=False))) == [
      ["torch"], ["cudnn", "levers-off"], ["flag-cublaslt"], ["cudnn-default"], ["xla"]]
  assert as_names(gpu.groups(on(cpu=True))) == [["torch"], names[1:]]
  base = os.environ.get("XLA_FLAGS", "")
  assert gpu.child_env("cublaslt", cpu=False)["XLA_FLAGS"].endswith(
      "--xla_gpu_enable_cublaslt=true")
  assert gpu.child_env("cublaslt", cpu=True).get("XLA_FLAGS", "") == base   # GPU flags: not here


def test_stage_timeout_keeps_the_later_stages_least():
  caps = {"a": (100, 10), "b": (200, 50)}
  assert device_check.stage_timeout(caps, ["a", "b"], 0, 120) == 70    # 120 - b's 50
  assert device_check.stage_timeout(caps, ["a", "b"], 0, 1000) == 100  # its cap
  assert device_check.stage_timeout(caps, ["a", "b"], 0, 55) is None   # 5 s < a's 10
  assert device_check.stage_timeout(caps, ["a", "b"], 1, 300) == 200
  assert device_check.stage_timeout(caps, ["a", "b"], 1, 40) is None


def test_verdicts_are_read_on_the_best_plain_causal_row():
  rows = [_row("cudnn", tokens_per_s=450e3, mfu=0.385), _row("xla", tokens_per_s=480e3, mfu=0.405),
          _row("cudnn-packed", tokens_per_s=600e3, mfu=0.5),      # not plain causal: not read
          _row("cudnn-remat", error="out of memory"), _row("torch", tokens_per_s=400e3)]
  v = gpu.verdicts(rows, [row.pop("result") for row in rows])
  assert v["best"] == "xla"
  assert v["tokens_per_s"] == {"value": 480e3, "target": 470e3, "pass": True, "aim": 520e3,
                               "aim_met": False}
  assert v["mfu"]["pass"] is True and v["mfu"]["aim_met"] is False
  assert v["vs_torch"]["value"] == pytest.approx(1.2) and v["vs_torch"]["pass"] is True
  # No PyTorch figure: no ratio, and no verdict on it.
  v = gpu.verdicts(rows[:2], [{"tokens_per_s": 400e3, "mfu": 0.34}, {"error": "x"}])
  assert v["tokens_per_s"]["pass"] is False and v["vs_torch"] == {
      "value": None, "target": 1.1, "pass": None}


def test_summary_verdicts_and_the_rerun_command():
  bench_rows = [_row("cudnn", tokens_per_s=500e3, mfu=0.43, step_s=0.131),
                _row("levers-off", tokens_per_s=400e3, step_s=0.164),
                _row("fused-loss", tokens_per_s=450e3, step_s=0.1456),
                _row("torch", tokens_per_s=400e3, step_s=0.164)]
  more_rows = [_row("cudnn-packed", tokens_per_s=468e3, step_s=0.14),
               _row("flag-cublaslt", tokens_per_s=510e3, step_s=0.1285),
               _row("flag-exhaustive-tiling", tokens_per_s=502e3, step_s=0.1306)]
  bench_v = gpu.verdicts(bench_rows, [row["result"] for row in bench_rows])
  parts = {p: {"earlier": {"ms": 50.0}, "now": {"ms": 40.0}} for p in gpu_parts.PARTS}
  results = {"dry": False, "stages": {
      "bench": {"status": "ok", "seconds": 150,
                "figures": {"rows": bench_rows, "verdicts": bench_v}},
      "parts": {"status": "ok", "seconds": 60, "figures": {"parts": parts}},
      "curriculum": {"status": "ok", "seconds": 190, "figures": {
          "runs": {"static": {"median_step_s": 0.15}},
          "overhead": {"value": 0.004, "target": 0.01, "pass": True}}},
      "tests": {"status": "ok", "seconds": 40, "figures": {"passed": 12}},
      "bench_more": {"status": "ok", "seconds": 80, "figures": {"rows": more_rows}}}}
  v = device_summary.summary(results)
  assert v["vs_torch"]["value"] == pytest.approx(1.25) and v["vs_torch"]["pass"] is True
  assert v["curriculum_overhead"]["pass"] is True
  assert v["host_pipeline_overhead"]["value"] == pytest.approx(0.15 / 0.14 - 1)
  assert v["gpu_tests"]["pass"] is True
  # The levers over levers-off (400K): 450K is +12.5% and 164 - 145.6 = 18.4 ms; all: +25%.
  assert v["levers"]["fused-loss"]["alone"] == pytest.approx(0.125)
  assert v["levers"]["fused-loss"]["saved_ms"] == pytest.approx(18.4)
  assert v["levers"]["cudnn"]["alone"] == pytest.approx(0.25)
  # A flag wins when it beats the product (500K) by more than 1%: 510K does, 502K does not.
  assert v["levers"]["flags"]["flag-cublaslt"]["wins"] is True
  assert v["levers"]["flags"]["flag-exhaustive-tiling"]["wins"] is False
  assert v["step_rest_ms"] == pytest.approx(131 - 120)
  results["verdicts"] = v
  lines = device_summary.lines(results)
  assert lines[0] == "verdicts:" and "PASS 500,000 tokens/s" in lines[1]
  assert any("KEEP cublaslt" in line for line in lines)
  assert device_summary.rerun(results) is None
  results["stages"]["curriculum"]["status"] = "timed out"
  results["stages"]["bench_more"]["status"] = "skipped"
  # install (45) + curriculum (150) + bench_more (240) + 20 s = 455 s, within one call's 460.
  assert device_summary.rerun(results) == (
      "bash bench/device_check.sh --only=curriculum,bench_more --budget=455")


def test_a_missed_target_says_by_how_much():
  rows = [_row("cudnn", tokens_per_s=423e3, mfu=0.36, step_s=0.155),
          _row("torch", tokens_per_s=405e3, step_s=0.162)]
  results = {"dry": False, "stages": {"bench": {"status": "ok", "seconds": 1, "figures": {
      "rows": rows, "verdicts": gpu.verdicts(rows, [row["result"] for row in rows])}}}}
  results["verdicts"] = device_summary.summary(results)
  line = device_summary.verdict_lines(results)[1]
  # 423K against 470K is 10.0% short; the 155 ms step would need to be 155 x 423 / 470 = 139.5 ms.
  assert line.startswith("  FAIL 423,000 tokens/s") and "short by 10.0%" in line
  assert "155.0 ms a step where 139.5 would do" in line


@pytest.mark.slow
def test_a_stage_past_its_cap_is_stopped_with_everything_it_started(tmp_path):
  ck = device_check.Check(str(tmp_path), dry=True, budget=0, wheels=str(tmp_path))
  try:
    t0 = time.perf_counter()
    code, text = ck.run(["bash", "-c", "sleep 120 & echo child $!; wait"], timeout=2)
    assert code is None and time.perf_counter() - t0 < 30
    child = int(re.search(r"child (\d+)", text).group(1))
    for _ in range(50):   # the grandchild, reparented when bash died, is gone too
      try:
        os.kill(child, 0)
      except ProcessLookupError:
        break
      time.sleep(0.1)
    else:
      pytest.fail(f"process {child} outlived its stage")
  finally:
    ck.close()
  assert "timed out after 2 s" in (tmp_path / "check.log").read_text()


@pytest.mark.slow
def test_xla_rejecting_the_tuned_flags_turns_the_check_to_the_default_ones(tmp_path, monkeypatch):
  # XLA aborts at start-up on a flag it does not know: the env stage finds out, and the bench and
  # the curriculum runs then leave the tuned flags out.
  monkeypatch.setitem(gpu.FLAG_SETS, "tuned", "--xla_no_such_flag_in_any_xla=true")
  ck = device_check.Check(str(tmp_path), dry=True, budget=0, wheels=str(tmp_path))
  try:
    status, info = device_check.stage_env(ck, timeout=120)
    assert status == "ok" and info["tuned_flags_accepted"] is False and not ck.tuned_flags
    commands = []
    monkeypatch.setattr(ck, "run", lambda cmd, *a, **k: (commands.append(cmd), (1, ""))[1])
    device_check.stage_bench(ck, timeout=100)
    device_check.stage_curriculum(ck, timeout=100)
  finally:
    ck.close()
  assert "--flags=default" in commands[0] and "--flags=default" in commands[1]
  # bench/gpu.py's --flags puts every JAX row on that set.
  rows = gpu._rows(gpu.argparse.Namespace(rows="cudnn,levers-off,torch", quick=False, cpu=False,
                                          steps=0, flags="default"))
  assert [row.get("flags") for row in rows] == ["default", "default", None]


@pytest.mark.parametrize("cpu", [False, True], ids=["gpu", "cpu"])
@pytest.mark.parametrize("name", [n for n in gpu.ROWS if gpu.ROWS[n]["kind"] == "jax"])
def test_every_bench_row_builds_a_valid_run(name, cpu):
  # The rows' configs validate here, so that no later validation breaks them unseen.
  spec = dict(gpu.ROWS[name], name=name, cpu=cpu, batch=4 if cpu else 64,
              seq_len=64 if cpu else 1024, steps=1)
  run = runconfig.build(gpu_step.config(spec))
  m = run.model
  if cpu:   # the tiny model; cuDNN rows run the "auto" attention, XLA's on a CPU
    assert (m.num_layers, m.d_model, m.max_len) == (2, 64, 64)
    assert m.attention_impl == ("auto" if spec["attn"] == "cudnn" else spec["attn"])
  else:
    assert (m.num_layers, m.d_model, m.dtype) == (12, 768, "bfloat16")
    assert m.attention_impl == spec["attn"]
  assert run.step.document_mask == spec["packed"] and m.remat == spec["remat"]
  assert run.step.grad_accum_steps == spec["accum"]
  step = gpu_step.step_config(run, spec)
  assert (step.xent is not None, step.lean_update, step.model.config.split_qkv) == (
      spec["fused_loss"], spec["lean_update"], spec["split_qkv"])


@pytest.mark.parametrize("cpu", [False, True], ids=["gpu", "cpu"])
def test_curriculum_runs_overrides_validate_on_andrea_120m(cpu):
  from andrea_jax.curriculum import registry
  from experiments import andrea120m
  for strategy in curriculum_gpu.STRATEGIES:
    c = andrea120m.get_config("v2:synthetic")
    flags = curriculum_gpu.overrides(cpu, 200, 20) + [f"--config.curriculum.mixer.name={strategy}"]
    for flag in flags:
      key, value = flag[len("--config."):].split("=", 1)
      *sections, field = key.split(".")
      node = c
      for section in sections:
        node = node[section]
      try:
        node[field] = ast.literal_eval(value)
      except (ValueError, SyntaxError):
        node[field] = value
    # As the launcher does after parsing: the mixer's name switches its section.
    registry.apply_name_override(c, {"curriculum.mixer.name": strategy})
    run = runconfig.build(c)
    assert run.curriculum.mixer_name == strategy
    assert (c.data.global_batch_size, c.optim.grad_accum_steps) == ((8, 1) if cpu else (64, 1))
    assert c.train.stop_step == 200 and c.train.num_steps == 200_000


def test_the_hlo_zip_stays_under_what_the_device_tool_brings_back(tmp_path, monkeypatch, capsys):
  # Rows are added in order while the zip is under its cap; the ones after are named, not added.
  assert gpu.HLO_ZIP_CAP < 16 * 2**20
  monkeypatch.setattr(gpu, "HLO_ZIP_CAP", 1000)
  hlo = tmp_path / "hlo"
  hlo.mkdir()
  for name in ("a", "b", "c"):
    (hlo / f"{name}.hlo.txt").write_text(os.urandom(3000).hex())   # incompressible: ~6 KB each
  gpu._write_hlo(str(hlo), str(tmp_path / "hlo.zip"))
  with zipfile.ZipFile(tmp_path / "hlo.zip") as z:
    assert z.namelist() == ["a.hlo.txt"]
  assert "left out" in (out := capsys.readouterr().out) and "b.hlo.txt, c.hlo.txt" in out
