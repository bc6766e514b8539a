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
