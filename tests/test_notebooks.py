"""The notebooks run top to bottom (small size), and are committed with their full-size outputs.

Each notebook is read into memory and executed with nbclient in a fresh kernel of this
interpreter, with ``ANDREA_NOTEBOOK_SMALL=1`` (every run shrunk) and its working directory and
temporary files under pytest's ``tmp_path``: the committed file is never rewritten.
"""

import re
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOK_DIR = Path(__file__).resolve().parent.parent / "notebooks"
NOTEBOOKS = sorted(NOTEBOOK_DIR.glob("*.ipynb"))
EXPECTED = {"attention_projection", "simplex_geometry", "terrain", "warmup_ablation"}
MAX_BYTES = 1_500_000
# What a notebook must not do itself: define a loss, take gradients, build an optimizer.
TRAINING_LOGIC = re.compile(r"\boptax\b|value_and_grad|jax\.grad\b|\.apply_gradients|"
                            r"softmax_cross_entropy")


def _code(nb):
  return [c for c in nb.cells if c.cell_type == "code"]


def test_every_notebook_is_here():
  assert {p.stem for p in NOTEBOOKS} == EXPECTED


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_committed_with_outputs_and_small_switch(path):
  nb = nbformat.read(path, as_version=4)
  nbformat.validate(nb)
  assert path.stat().st_size < MAX_BYTES, f"{path.name} is {path.stat().st_size:,} bytes"
  cells = _code(nb)
  assert "ANDREA_NOTEBOOK_SMALL" in cells[0].source, "the first cell reads the small-size switch"
  for i, cell in enumerate(cells):
    assert cell.execution_count is not None, f"code cell {i} of {path.name} was not executed"
    assert not [o for o in cell.outputs if o.output_type == "error"], (
        f"code cell {i} of {path.name} was committed with an error")
  assert any("image/png" in o.get("data", {}) for c in cells for o in c.outputs), (
      f"{path.name} has no figure")
  # Executed at full size: the switch cell printed small=False.
  assert "small=False" in "".join(o.get("text", "") for o in cells[0].outputs)
  # The last cell is the conclusion, written from the measured numbers.
  assert nb.cells[-1].cell_type == "markdown" and "Conclusion" in nb.cells[-1].source


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_no_training_logic_in_cells(path):
  nb = nbformat.read(path, as_version=4)
  for i, cell in enumerate(_code(nb)):
    found = TRAINING_LOGIC.search(cell.source)
    assert found is None, f"code cell {i} of {path.name} uses {found.group(0)!r}: call andrea_jax"


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_runs_top_to_bottom_small(path, tmp_path, data_cache, monkeypatch):
  nb = nbformat.read(path, as_version=4)
  monkeypatch.setenv("ANDREA_NOTEBOOK_SMALL", "1")
  monkeypatch.setenv("TMPDIR", str(tmp_path))        # the notebooks' run directories
  client = NotebookClient(nb, timeout=600, kernel_name="python3",
                          resources={"metadata": {"path": str(tmp_path)}})
  client.execute()      # raises CellExecutionError naming the cell on the first failure
  first = "".join(o.get("text", "") for o in _code(nb)[0].outputs)
  assert "small=True" in first
