"""study/mixing/inrun_probe.py's in-run elasticity fit and its design, against losses built from known
elasticities. (The screen on the built-in corpus is the benchmark's job.)"""

import json

import numpy as np
import pytest

from study.mixing import inrun_probe as bench


def _design_rows(num_sources=4, block=5, blocks=8, batch=32):
  # A 4-source two-level design (Sylvester, order 8: columns 1-4), high = 4x low.
  h = np.array([[1, 1], [1, -1]])
  h = np.kron(np.kron(h, h), h)[:, 1:num_sources + 1]
  w = 4.0 ** (h / 2)
  w /= w.sum(axis=1, keepdims=True)
  return np.repeat(w[:blocks], block, axis=0) * batch


def test_exact_power_law_gives_the_elasticities_back():
  rows = _design_rows()
  steps = np.arange(len(rows))
  b = np.array([0.05, 0.3, -0.1, 0.6])
  before = np.cumsum(rows, axis=0) - rows
  share = before / np.maximum(before.sum(axis=1, keepdims=True), 1e-12)
  with np.errstate(divide="ignore"):
    loss = 4.0 - 0.2 * np.log(steps + 1.0)[:, None] - b * np.log(4 * share)
  est = bench.inrun_elasticity(steps, rows, loss, start=5, end=len(rows))
  np.testing.assert_allclose(est, b, atol=1e-9)
  # Centring across sources removes a common term; with it alone (b = 0) the estimates are 0.
  flat = bench.inrun_elasticity(steps, rows, 4.0 - 0.5 * np.log(steps + 1.0)[:, None]
                                + 0 * rows, start=5, end=len(rows), centred=True)
  np.testing.assert_allclose(flat, 0.0, atol=1e-9)


def test_missing_rows_and_unvaried_shares():
  rows = _design_rows()
  steps = np.arange(len(rows))
  loss = np.full(rows.shape, 2.0)
  loss[:, 1] = np.nan                     # a source never logged: no estimate
  rows_fixed = rows.copy()
  rows_fixed[:, 2] = 8.0                  # an unvaried absolute count still varies in share
  est = bench.inrun_elasticity(steps, rows_fixed, loss, start=5, end=len(rows))
  assert np.isnan(est[1]) and np.isfinite(est[0])
  uniform = np.full((40, 4), 8.0)         # equal shares throughout: the regressor is constant
  est = bench.inrun_elasticity(np.arange(40), uniform, np.full((40, 4), 2.0), 5, 40)
  assert np.isnan(est).all()


def test_every_step_must_be_logged():
  rows = _design_rows()
  with pytest.raises(ValueError, match="log_every = 1"):
    bench.inrun_elasticity(np.arange(len(rows)) * 2, rows, np.ones_like(rows), 0, 10)


def test_read_steps_orders_and_scales(tmp_path):
  recs = [{"step": 1, "loss": 2.0, "share/a": 0.25, "share/b": 0.75, "loss/b": 1.5},
          {"eval/mean_loss": 3.0, "step": 1},
          {"step": 0, "loss": 2.5, "share/a": 0.5, "share/b": 0.5, "loss/a": 2.4, "loss/b": 2.6}]
  (tmp_path / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in recs))
  steps, rows, loss = bench.read_steps(str(tmp_path), ["a", "b"], batch_rows=32)
  np.testing.assert_array_equal(steps, [0, 1])
  np.testing.assert_allclose(rows, [[16, 16], [8, 24]])
  np.testing.assert_allclose(loss, [[2.4, 2.6], [np.nan, 1.5]])


def test_design_geometries_hold_each_block_then_the_full_simplex():
  mixtures = np.array([[0.5, 0.25, 0.25], [0.2, 0.4, 0.4]])
  g = bench.design_geometries(mixtures, 10, 100, ["a", "b", "c"])
  assert [g[k].start_step for k in ("block00", "block01", "after")] == [0, 10, 20]
  assert g.block01.mixture.b == pytest.approx(0.4)
  assert "after" not in bench.design_geometries(mixtures, 50, 100, ["a", "b", "c"])
