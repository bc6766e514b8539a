"""The documents: every relative link resolves, every command the README, docs/ and notebooks/
show is run by a test, and none crashes.

A command is a line of a ```bash block (backslash continuations joined, comments dropped); the
commands of one block run in order in one scratch directory that holds the repository's
``experiments/`` and ``bench/`` (so ``runs/...`` and ``/tmp/...`` paths land there). A training
command runs as printed with its length cut to :data:`STEPS` steps (``train.stop_step``) and without
the figure and the TensorBoard files (``tests/test_demo.py`` checks those): the demo's own model,
batch and data. The blocks of docs/ run in ``tests/test_docs_manual.py``,
``tests/test_docs_walkthroughs.py`` and ``tests/test_docs_pages.py`` (the test workers balance by
file). Where a command reads data the test makes it: the local files the page names, the modules and
files the page's other blocks show (``mymixers.py``, ``myformats.py``, ``fit.json``, a page's
``# name.py`` blocks), and local stand-ins for Hugging Face datasets with the fields of the real
ones, read offline in place of the names. The GPU-sized ANDREA-120M commands run on 8 simulated CPU devices
with the model and batch shrunk. Commands run elsewhere or not at all are listed in
:data:`ELSEWHERE` and :data:`NOT_RUN` with the reason. The README's python blocks run in
``tests/test_custom_loop.py`` (the loop) and ``tests/test_demo.py`` (sampling from the demo's
checkpoint), which runs ``make demo``'s command.
"""

import json
import os
import pathlib
import re
import shlex
import subprocess
import sys

import pytest

from tests.util import REPO

DOCS = [REPO / "README.md", REPO / "notebooks" / "README.md",
        *sorted((REPO / "docs").glob("*.md"))]
ALL_MARKDOWN = sorted(p for p in REPO.rglob("*.md")
                      if not any(part.startswith(".") or part in ("runs", "node_modules")
                                 for part in p.relative_to(REPO).parts))

# Steps a documented training command runs here: its length is cut, nothing else.
STEPS = 12


def _blocks(text: str, lang: str) -> list[str]:
  return re.findall(rf"```{lang}\n(.*?)```", text, re.S)


def test_every_relative_link_resolves():
  bad = []
  for md in ALL_MARKDOWN:
    text = md.read_text()
    for target in re.findall(r"\]\(([^)\s]+)\)", text) + re.findall(r'src="([^"]+)"', text):
      if re.match(r"[a-z]+://|#|mailto:", target):
        continue
      path = (md.parent / target.split("#")[0]).resolve()
      if not path.exists():
        bad.append(f"{md.relative_to(REPO)}: {target}")
  assert not bad, "\n".join(bad)


def test_the_readme_is_a_front_door():
  text = (REPO / "README.md").read_text()
  assert len(text.splitlines()) <= 300
  for stale in (r"\b\d+ tests\b", r"\b[0-9a-f]{7,40}\b(?=\))", r"\bissue #?\d+", r"\bseed \d+\b"):
    assert not re.search(stale, text), stale
  assert sum(p.stat().st_size for p in (REPO / "bench").glob("*.md")) <= 40_000


def _workspace(tmp_path) -> pathlib.Path:
  """A scratch directory a documented command runs in, as if it were the repository's root."""
  work = tmp_path / "work"
  work.mkdir()
  (work / "experiments").symlink_to(REPO / "experiments")
  (work / "bench").symlink_to(REPO / "bench")
  return work


def _environment(work: pathlib.Path) -> dict[str, str]:
  """A documented command's environment: offline, ``work`` first on the path, and compiled as a
  user's command is, fully optimised (the suite's own programs are compiled at LLVM -O0, see
  ``conftest.py``). With the suite's shared XLA cache a program is compiled once and run by many
  commands, so optimising it pays: a 12-step demo command takes 11-13 s against 17-19 s at -O0 on
  2 cores, warm; cold, both about 26 s."""
  env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(work), str(REPO)]),
             HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", PYTHONUNBUFFERED="1")
  env.pop("JAX_DISABLE_MOST_OPTIMIZATIONS", None)
  return env


def _localise(command: str, work: pathlib.Path, steps: bool = True) -> list[str]:
  """The command's words, ``/tmp/...`` paths moved into ``work`` and a training command cut to
  :data:`STEPS` steps (``steps``)."""
  (work / "tmp").mkdir(exist_ok=True)
  words = [w.replace("/tmp/", f"{work}/tmp/") for w in shlex.split(command)]
  if words[:3] == ["python", "-m", "andrea_jax.main"] and steps:
    words += [f"--config.train.stop_step={STEPS}", "--config.train.progress_bar=False",
              "--config.train.plot=False", "--config.train.tensorboard=False"]
  if words[0] == "python":
    words[0] = sys.executable
  return words


def run_documented(command: str, work: pathlib.Path, extra: tuple[str, ...] = (),
                   env: dict[str, str] | None = None, timeout: float = 900, raw: bool = False,
                   steps: bool = True) -> str:
  """Runs one command in ``work`` (``raw``: as given, else localised); fails the test, with its
  output, if it fails."""
  (work / "tmp").mkdir(exist_ok=True)
  words = (shlex.split(command) if raw else _localise(command, work, steps)) + list(extra)
  if words[0] == "python":
    words[0] = sys.executable
  out = subprocess.run(words, cwd=work, env=env or _environment(work), capture_output=True,
                       text=True, timeout=timeout)
  assert out.returncode == 0, f"{command}\n{out.stdout[-2000:]}\n{out.stderr[-4000:]}"
  return out.stdout + out.stderr


def _files(work: pathlib.Path) -> None:
  """The local files the documented own-data commands read (corpus/...)."""
  from andrea_jax.data.corpora.synthetic import builtin_documents
  for name, style in (("code", "repo-docstrings"), ("docs", "gutenberg"),
                      ("reference", "dictionary")):
    folder = work / "corpus" / name
    folder.mkdir(parents=True, exist_ok=True)
    docs = builtin_documents(style, scale=0.05)
    if name == "docs":   # text files, documents separated by the separator line
      (folder / "a.txt").write_text("\n<|endoftext|>\n".join(docs))
    elif name == "reference":
      import pyarrow as pa
      import pyarrow.parquet as pq
      pq.write_table(pa.table({"text": docs}), work / "corpus" / "reference.parquet")
    else:
      with open(folder / "a.jsonl", "w") as f:
        f.writelines(json.dumps({"text": d}) + "\n" for d in docs)


# Commands another test runs (at the scale the page shows), and commands not run here, with why.
ELSEWHERE = {
    "bash bench/device_check.sh":
        "tests/test_bench_gpu.py::test_device_check_dry_run_end_to_end (--dry: the same stages "
        "on this CPU with tiny shapes)",
    "python -m andrea_jax.terrain --workdir runs/tiny --step 1000":
        "tests/test_terrain_cli.py::test_the_demos_terrain_runs_within_a_memory_cap (the "
        "demo's checkpoint at its own sizes, fewer samples, in a 5 GiB address space)",
    "make demo": "tests/test_demo.py (the Makefile's command, to the demo's first evaluations)",
}
NOT_RUN = {
    "make test": "the test suite itself (CI runs it)",
    "make gpu-wheels": "it downloads wheels for another machine",
    'pip install -e ".[gpu]"': "it installs software",
    "python -m bench.faults --quick": "a benchmark (minutes); tests/faults/ runs each of its "
                                      "campaigns with one fault of each kind",
    # docs/lifecycle.md's path from GPT-2's weights: the offline path above it runs the same
    # commands on the demo's export (tests/test_pretrained.py starts runs from transformers'
    # folders, tests/test_harness.py scores exports against lm-eval's hf backend).
    "python -m andrea_jax.main --config=experiments/own_data.py:smoltalk --workdir=runs/gpt2-chat "
    "--config.init.from_hf=hf:gpt2 --config.data.tokenizer=hf:gpt2 --config.model.num_layers=12 "
    "--config.model.num_heads=12 --config.model.d_model=768 --config.model.d_mlp=3072 "
    "--config.model.max_len=1024 --config.model.dtype=bfloat16 --config.data.seq_len=1024 "
    "--config.data.global_batch_size=16 --config.optim.peak_lr=5e-5 "
    "--config.data.files.smoltalk.format=hf "
    "--config.data.files.smoltalk.dataset=HuggingFaceTB/smoltalk "
    "--config.data.files.smoltalk.subset=all --config.data.files.smoltalk.layout=messages "
    "--config.data.files.smoltalk.template=plain --config.data.files.smoltalk.loss_on=assistant":
        "it downloads GPT-2's weights and tokenizer from the Hub and trains GPT-2 small (a GPU)",
    'python -m andrea_jax.sample --workdir runs/gpt2-chat --chat --prompt "How do I read a file '
    'in Python?"': "it reads the GPT-2 fine-tune above, which is not run",
    "python -m andrea_jax.export --workdir runs/gpt2-chat --out runs/gpt2-chat-hf":
        "it reads the GPT-2 fine-tune above, which is not run",
    "python -m andrea_jax.harness --hf hf:gpt2 --tasks hellaswag":
        "it downloads GPT-2 and HellaSwag from the Hub",
    "python -m andrea_jax.harness --hf runs/gpt2-chat-hf --tasks hellaswag":
        "it downloads HellaSwag and reads the GPT-2 fine-tune above, which is not run",
}
# The Hub datasets the pages name, made locally with the fields of the real ones.
HUB_SPLITS = {"HuggingFaceTB/smoltalk": "train", "OpenAssistant/oasst1": "train"}
# The ANDREA-120M commands on a CPU: 8 simulated devices, the model and the batch shrunk.
SHRINK_120M = ("--config.model.num_layers=2", "--config.model.d_model=64",
               "--config.model.num_heads=2", "--config.model.d_mlp=256",
               "--config.model.dtype=float32", "--config.data.seq_len=64",
               "--config.data.global_batch_size=16", "--config.optim.grad_accum_steps=1",
               "--config.eval.sequences_per_source=1", "--config.eval.sample_tokens=4")
STEPS_120M = 2


# The rest: test_docs_manual.py, test_docs_pages.py and test_docs_walkthroughs.py.
FRONT = [REPO / "README.md", REPO / "notebooks" / "README.md"]


def blocks(pages: list[pathlib.Path] = DOCS) -> list[tuple[str, list[str]]]:
  """``(page:block number, commands)`` for every bash block of ``pages``."""
  out = []
  for page in pages:
    for i, block in enumerate(_blocks(page.read_text(), "bash")):
      commands = documented_commands_of(block)
      if commands:
        out.append((f"{page.relative_to(REPO)}:{i}", commands))
  return out


def documented_commands_of(block: str) -> list[str]:
  out = []
  for command in re.sub(r"\\\n\s*", " ", block).splitlines():
    command = re.sub(r"\s+#.*$", "", command).strip()
    if command and not command.startswith("#"):
      out.append(re.sub(r"\s+", " ", command))
  return out


def documented_commands(path: pathlib.Path) -> list[str]:
  """The commands of ``path``'s bash blocks, one string each."""
  return [c for block in _blocks(path.read_text(), "bash") for c in documented_commands_of(block)]


def _runnable(command: str) -> bool:
  return command not in ELSEWHERE and command not in NOT_RUN


def test_every_documented_command_is_run_or_said_why_not():
  """A command no rule covers would fail in :func:`test_documented_block_runs`; these are the
  rest, each known by name (a renamed or reworded command is noticed here)."""
  shown = {c for _, commands in blocks() for c in commands}
  assert set(ELSEWHERE) | set(NOT_RUN) <= shown, sorted((set(ELSEWHERE) | set(NOT_RUN)) - shown)
  assert all(c.split()[0] in ("python", "make", "bash", "pip") for c in shown), shown


def _shown_file(name: str) -> str:
  """The content of a file a page shows: a python block whose first line is ``# <name>``, or the
  json block before a command that names ``<name>``."""
  for page in DOCS:
    text = page.read_text()
    for block in _blocks(text, "python"):
      if block.startswith(f"# {name}\n"):
        return block
    if name.endswith(".json") and name in text:
      at = text.index(name)
      return _blocks(text[:at], "json")[-1]
  raise AssertionError(f"no page shows {name}")


def _hub_stand_in(work: pathlib.Path, spec) -> str:
  """A ``save_to_disk`` dataset with the split and the fields ``spec`` reads (a HubSpec)."""
  datasets = pytest.importorskip("datasets")
  from andrea_jax.data.corpora.synthetic import builtin_documents
  text = builtin_documents("chat", scale=0.05)
  pairs = list(zip(text[::2], text[1::2]))
  extra = {spec.filter_field: (spec.filter_value if not isinstance(spec.filter_value, tuple)
                               else spec.filter_value[0])} if spec.filter_field else {}
  if spec.layout == "messages":
    rows = [{spec.messages_field: [{"role": "user", "content": a},
                                   {"role": "assistant", "content": b}], **extra}
            for a, b in pairs]
  elif spec.layout == "tree":
    rows = []
    for i, (a, b) in enumerate(pairs):
      rows += [{"message_id": f"p{i}", "parent_id": None, spec.text_field: a, "role": "prompter",
                **extra},
               {"message_id": f"a{i}", "parent_id": f"p{i}", spec.text_field: b,
                "role": "assistant", **extra}]
  else:
    rows = [{spec.text_field: a + "\n" + b, **extra} for a, b in pairs]
  path = work / "hub" / spec.dataset.replace("/", "__")
  if not path.exists():
    datasets.DatasetDict({spec.split: datasets.Dataset.from_list(rows)}).save_to_disk(str(path))
  return str(path)


def _localised_block(commands: list[str], work: pathlib.Path) -> list[tuple[list[str], bool]]:
  """``(words, expected to succeed)`` for each runnable command of a block, the test's changes
  made: Hub names replaced by local stand-ins, the ANDREA-120M run shrunk and its missing sources
  given data (after the command as printed, which refuses to start without them)."""
  from andrea_jax.data.hub.andrea_sources import HUB_SOURCES
  from andrea_jax.data.hub.datasets import HubSpec
  from andrea_jax.sources import source_key
  out = []
  for command in filter(_runnable, commands):
    words = _localise(command, work)
    for name, split in HUB_SPLITS.items():
      if any(w.endswith(f"dataset={name}") for w in words):
        field = next(w for w in words if w.endswith(f"dataset={name}"))
        source = field.split(".")[-2]
        prefix = f"--config.data.files.{source}."
        flag = lambda f, words=words, prefix=prefix: next(
            (w.split("=", 1)[1] for w in words if w.startswith(f"{prefix}{f}=")), None)
        spec = HubSpec(name, split=split, layout=flag("layout") or "text",
                       filter_field=flag("filter_field") or "", filter_value=flag("filter_value"))
        words[words.index(field)] = f"{field.split('=')[0]}={_hub_stand_in(work, spec)}"
    if any("andrea120m.py" in w for w in words):
      extra = list(SHRINK_120M)
      if words[2] == "andrea_jax.main":
        words = [w for w in words if not w.startswith("--config.train.stop_step=")]
        extra.append(f"--config.train.stop_step={STEPS_120M}")
      if not any(w.endswith(":synthetic") for w in words):
        for source, verified in HUB_SOURCES.items():
          extra.append(f"--config.data.files.{source_key(source)}.dataset="
                       + _hub_stand_in(work, verified.spec))
        if words[2] == "andrea_jax.main":   # as printed: refused, naming the sources left
          out.append((words + extra, False))
        missing = work / "corpus" / "missing.txt"
        missing.parent.mkdir(exist_ok=True)
        from andrea_jax.data.corpora.synthetic import builtin_documents
        missing.write_text("\n<|endoftext|>\n".join(builtin_documents("gutenberg", scale=0.05)))
        from experiments import andrea120m
        for source in andrea120m.get_config("v3:synthetic").sources:
          if source not in HUB_SOURCES:
            extra += [f"--config.data.files.{source_key(source)}.paths={missing}",
                      f"--config.data.files.{source_key(source)}.format=text"]
      words += extra
    out.append((words, True))
  return out


def _eight_devices(env: dict[str, str]) -> dict[str, str]:
  return dict(env,
              XLA_FLAGS=os.environ["XLA_FLAGS"] + " --xla_force_host_platform_device_count=8")


@pytest.mark.slow
@pytest.mark.parametrize("where,commands", blocks(FRONT), ids=[w for w, _ in blocks(FRONT)])
def test_documented_block_runs(where, commands, tmp_path, data_cache):
  run_block(where, commands, tmp_path)


def run_block(where: str, commands: list[str], tmp_path: pathlib.Path) -> None:
  """Every runnable command of one bash block, in order, as the page prints it (changed only as
  the module docstring says): each exits 0 and a training command reaches its last step."""
  if not any(map(_runnable, commands)):
    pytest.skip(f"{where}: every command runs elsewhere or is not run ({commands})")
  work = _workspace(tmp_path)
  _files(work)
  for name in ("mymixers.py", "myformats.py", "fit.json"):
    if any(name.split(".")[0] in c for c in commands):
      (work / name).write_text(_shown_file(name))
  page = (REPO / where.split(":")[0]).read_text()
  for block in _blocks(page, "python"):   # the modules the page shows, beside its commands
    first = block.split("\n", 1)[0]
    if re.fullmatch(r"# \w+\.py", first):
      (work / first[2:]).write_text(block)
  env = _environment(work)
  for words, succeeds in _localised_block(commands, work):
    run_env = _eight_devices(env) if any("andrea120m.py" in w for w in words) else env
    if not succeeds:
      out = subprocess.run(words, cwd=work, env=run_env, capture_output=True, text=True,
                           timeout=900)
      assert out.returncode == 1 and "no data for the sources" in out.stderr, out.stderr[-3000:]
      continue
    log = run_documented(shlex.join(words), work, env=run_env, raw=True)
    if words[2] == "andrea_jax.main":
      steps = STEPS_120M if any("andrea120m.py" in w for w in words) else STEPS
      assert f"stopped at train.stop_step: {steps} steps" in log, log[-3000:]
