"""``python -m andrea_jax.main`` on bad input: one line that names the field, no traceback."""

import pytest
import subprocess
import sys

from tests.util import REPO


def _main(tmp_path, *overrides, config="tiny.py"):
  return subprocess.run([sys.executable, "-m", "andrea_jax.main",
                         f"--config={REPO / 'experiments' / config}",
                         f"--workdir={tmp_path / 'run'}", *overrides],
                        cwd=REPO, capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_an_invalid_value_is_one_clear_line(tmp_path):
  out = _main(tmp_path, "--config.optim.peak_lr=-1")
  assert out.returncode == 1, out.stdout + out.stderr
  assert out.stderr.startswith("error: optim.peak_lr must be > 0, got -1.0\n"), out.stderr
  assert "Traceback" not in out.stderr
  assert not (tmp_path / "run" / "checkpoints").exists()    # rejected before anything ran


@pytest.mark.slow
def test_verbosity_shows_the_traceback(tmp_path):
  out = _main(tmp_path, "--config.optim.peak_lr=-1", "--verbosity=0")
  assert out.returncode == 1
  assert "Traceback" in out.stderr and "ValueError: optim.peak_lr must be > 0" in out.stderr


@pytest.mark.slow
def test_bad_data_is_one_clear_line_naming_the_file(tmp_path):
  """A text file without a separator line is one document, held out for hermes3-general: no
  training tokens, found while opening the data (after validation)."""
  book = tmp_path / "book.txt"
  book.write_text("one long document\nwithout a separator line\n")
  out = _main(tmp_path, f"--config.data.files.hermes3_general.paths={book}",
              "--config.data.files.hermes3_general.format=text",
              f"--config.data.cache_dir={tmp_path / 'cache'}",
              config="own_data.py:hermes3-general")
  assert out.returncode == 1, out.stdout + out.stderr
  first = next(line for line in out.stderr.splitlines() if line.startswith("error: "))
  assert first.startswith(f"error: {tmp_path / 'cache'}") and first.endswith(
      "manifest.json: required source 'hermes3-general' has 0 training tokens (its 1 document "
      "went to the held-out split: a source needs 2 documents or more, one of its first two is "
      "held out; in a text file a line that is exactly '<|endoftext|>' separates documents, and a "
      "file without one is a single document)"), out.stderr
  assert "Traceback" not in out.stderr


@pytest.mark.slow
def test_a_bad_distributed_section_or_cache_dir_is_one_clear_line(tmp_path):
  out = _main(tmp_path, "--config.distributed.coordinator_address=localhost:12345")
  assert out.returncode == 1, out.stdout + out.stderr
  assert out.stderr.startswith("error: distributed.coordinator_address = 'localhost:12345' needs "
                               "num_processes"), out.stderr
  assert "Traceback" not in out.stderr
  a_file = tmp_path / "a_file"
  a_file.write_text("not a directory")
  out = _main(tmp_path, f"--config.data.cache_dir={a_file}")
  assert out.returncode == 1, out.stdout + out.stderr
  assert out.stderr.startswith(f"error: data.cache_dir = '{a_file}' is a file, not a directory"), \
      out.stderr
  assert "Traceback" not in out.stderr


@pytest.mark.slow
def test_a_workdir_that_is_a_file_is_one_clear_line(tmp_path):
  (tmp_path / "run").write_text("not a directory")
  out = _main(tmp_path)
  assert out.returncode == 1, out.stdout + out.stderr
  assert out.stderr.startswith(f"error: {tmp_path / 'run'} is a file, not a directory"), out.stderr
  assert "Traceback" not in out.stderr


@pytest.mark.slow
def test_every_failing_process_prints_its_error_named():
  # A file missing on one host only: that host's log must say so, not stay silent. In a process of
  # its own (main defines the absl flags, which other modules' commands define too).
  code = ("import jax\n"
          "jax.process_count = lambda: 2\n"
          "jax.process_index = lambda: 1\n"
          "from andrea_jax import main\n"
          "main._fail(ValueError('data.prepared_dir: no directory /x'), 'kept')\n")
  out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                       timeout=120)
  assert out.returncode == 1, out.stdout + out.stderr
  assert out.stderr.startswith("error: process 1 of 2: data.prepared_dir: no directory /x\n"
                               "(kept;"), out.stderr
