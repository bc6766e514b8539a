"""The ``andrea-train`` console script: its ``--help`` lists the run's flags, as ``-m`` does."""

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tests.util import REPO

_FLAG_LINES = (
    "  --config: Run configuration file (experiments/*.py).",
    "  --workdir: Directory for checkpoints, logs and plots; re-running with the same",
)


def _console_script_command():
  """The installed ``andrea-train``, or the same entry point as pip's generated script runs it."""
  target = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]["andrea-train"]
  assert target == "andrea_jax.main:run"
  installed = Path(sys.executable).parent / "andrea-train"
  if installed.exists():
    return [str(installed)]
  return [sys.executable, "-c", "import sys; sys.argv[0] = 'andrea-train'; "
          "from andrea_jax.main import run; sys.exit(run())"]


@pytest.mark.slow
@pytest.mark.parametrize("how", ["console script", "python -m"])
def test_help_lists_the_config_and_workdir_flags(how):
  command = (_console_script_command() if how == "console script"
             else [sys.executable, "-m", "andrea_jax.main"])
  out = subprocess.run(command + ["--help"], cwd=REPO, capture_output=True, text=True,
                       timeout=120)
  lines = out.stdout.splitlines()
  for line in _FLAG_LINES:
    assert line in lines, out.stdout + out.stderr
  # The usage text is andrea_jax.main's docstring, not a bare USAGE line.
  assert lines[0].startswith("Command line: ``andrea-train --config=experiments/tiny.py"), out.stdout
  assert "Try --helpfull to get a list of all flags." in lines


SCRIPTS = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]


def _script_command(name: str) -> list[str]:
  """The installed console script ``name``, or its entry point run as pip's script runs it."""
  installed = Path(sys.executable).parent / name
  if installed.exists():
    return [str(installed)]
  module, func = SCRIPTS[name].split(":")
  return [sys.executable, "-c", f"import sys; sys.argv[0] = {name!r}; "
          f"from {module} import {func}; sys.exit({func}())"]


def test_every_console_script_is_shown_in_the_readme_or_the_docs():
  pages = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
  text = "\n".join(p.read_text() for p in pages)
  assert not [name for name in SCRIPTS if f"`{name}`" not in text]


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(set(SCRIPTS) - {"andrea-train"}))
def test_each_console_script_runs_its_modules_command_line(name):
  """``--help`` through the console script prints the usage of the ``python -m`` command the docs
  show (and run), so the script and the documented command are one program."""
  module = SCRIPTS[name].split(":")[0]
  out = subprocess.run(_script_command(name) + ["--help"], cwd=REPO, capture_output=True,
                       text=True, timeout=120)
  assert out.returncode == 0, out.stderr
  assert out.stdout.startswith(f"usage: python -m {module} "), out.stdout[:200]
