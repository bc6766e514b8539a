"""``python -m andrea_jax.main`` on bad input: one line that names the field, no traceback."""

import subprocess
import sys

from conftest import REPO


def _main(tmp_path, *overrides):
  return subprocess.run([sys.executable, "-m", "andrea_jax.main",
                         f"--config={REPO / 'experiments' / 'tiny.py'}",
                         f"--workdir={tmp_path / 'run'}", *overrides],
                        cwd=REPO, capture_output=True, text=True, timeout=300)


def test_an_invalid_value_is_one_clear_line(tmp_path):
  out = _main(tmp_path, "--config.optim.peak_lr=-1")
  assert out.returncode == 1, out.stdout + out.stderr
  assert out.stderr.startswith("error: optim.peak_lr must be > 0, got -1.0\n"), out.stderr
  assert "Traceback" not in out.stderr
  assert not (tmp_path / "run" / "checkpoints").exists()    # rejected before anything ran


def test_verbosity_shows_the_traceback(tmp_path):
  out = _main(tmp_path, "--config.optim.peak_lr=-1", "--verbosity=0")
  assert out.returncode == 1
  assert "Traceback" in out.stderr and "ValueError: optim.peak_lr must be > 0" in out.stderr
