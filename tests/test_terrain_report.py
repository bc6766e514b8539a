"""The basin report (numbers, strict JSON, files) and the figures."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from matplotlib.figure import Figure

from andrea_jax import terrain

_PNG = b"\x89PNG\r\n\x1a\n"


def _quadratic():
  rng = np.random.default_rng(0)
  q, _ = np.linalg.qr(rng.normal(size=(6, 6)))
  lam = np.array([5.0, 2.0, 1.0, 0.5, 0.25, 0.1])
  A = (q * lam) @ q.T
  A_j = jnp.asarray(A, jnp.float32)
  params = {"kernel": jnp.asarray(rng.normal(size=(3, 2)), jnp.float32)}
  return (lambda p: 0.5 * p["kernel"].reshape(-1) @ A_j @ p["kernel"].reshape(-1)), params, A, lam


@pytest.mark.slow
def test_basin_report_numbers_are_the_known_ones_and_the_files_are_written(tmp_path):
  loss_fn, params, A, lam = _quadratic()
  out = tmp_path / "basin" / "step_100"
  rep = terrain.write_basin_report(loss_fn, params, jax.random.key(0), out, title="step 100",
                                   sigmas=[0.1, 0.5], num_samples=4, hessian_k=2, hessian_iters=6,
                                   trace_samples=3, slice_points=5)
  assert json.loads((out / "basin.json").read_text()) == rep
  for name in ("slice_1d.png", "slice_2d.png", "sharpness.png"):
    assert (out / name).read_bytes()[:8] == _PNG
  w = np.asarray(params["kernel"], np.float64).reshape(-1)
  assert rep["num_params"] == 6
  np.testing.assert_allclose(rep["loss"], 0.5 * w @ A @ w, rtol=1e-5)
  np.testing.assert_allclose(rep["param_norm"], np.linalg.norm(w), rtol=1e-6)
  np.testing.assert_allclose(rep["hessian"]["top_eigenvalues"], [5.0, 2.0], atol=1e-5)
  assert rep["hessian"]["num_iters"] == 6
  assert rep["sharpness"]["sigmas"] == [0.1, 0.5]
  assert len(rep["sharpness"]["mean_increase"]) == 2
  alphas = np.asarray(rep["slice_1d"]["alphas"])
  np.testing.assert_allclose(alphas, [-1.0, -0.5, 0.0, 0.5, 1.0])
  s1, s2 = np.asarray(rep["slice_1d"]["losses"]), np.asarray(rep["slice_2d"]["losses"])
  assert s2.shape == (5, 5)
  # The 1-D slice runs along d_x: it is the beta = 0 column of the 2-D slice, and L(w) at alpha = 0.
  np.testing.assert_allclose(s1, s2[:, 2], rtol=1e-5)
  np.testing.assert_allclose(s1[2], rep["loss"], rtol=1e-6)
  # A quadratic along a line is a parabola: third differences vanish.
  np.testing.assert_allclose(np.diff(s1, 3), 0.0, atol=1e-4 * np.max(np.abs(s1)))


@pytest.mark.slow
def test_diverged_points_become_null_and_the_report_can_skip_the_hessian():
  def loss_fn(p):
    return jnp.where(jnp.max(jnp.abs(p["k"])) > 5.0, jnp.inf, jnp.sum(p["k"] ** 2))

  params = {"k": jnp.ones((2, 2))}
  rep = terrain.basin_report(loss_fn, params, jax.random.key(1), sigmas=[0.1, 50.0], num_samples=2,
                             hessian_k=0, trace_samples=0, slice_points=3, slice_range=100.0)
  assert rep["hessian"] == {}
  assert rep["sharpness"]["mean_increase"][1] is None
  assert rep["slice_1d"]["losses"][0] is None and rep["slice_1d"]["losses"][1] == 4.0
  json.dumps(rep, allow_nan=False)


def test_basin_report_rejects_bad_settings():
  loss_fn, params, _, _ = _quadratic()
  with pytest.raises(ValueError, match="basin_report: slice_points must be >= 2, got 1"):
    terrain.basin_report(loss_fn, params, jax.random.key(0), slice_points=1)
  with pytest.raises(ValueError, match="sigmas"):
    terrain.basin_report(loss_fn, params, jax.random.key(0), sigmas=[])
  with pytest.raises(ValueError, match="basin_report: hessian_k must be >= 0, got -1"):
    terrain.basin_report(loss_fn, params, jax.random.key(0), hessian_k=-1)
  with pytest.raises(TypeError, match="basin_report: num_samples must be an integer, got 2.0"):
    terrain.basin_report(loss_fn, params, jax.random.key(0), num_samples=2.0)
  # Lanczos finds at most hessian_iters eigenvalues: asking for more is refused, not cut short.
  with pytest.raises(ValueError, match=r"hessian_k = 5 exceeds hessian_iters = 2: raise"):
    terrain.basin_report(loss_fn, params, jax.random.key(0), hessian_k=5, hessian_iters=2)
  n = sum(np.size(x) for x in jax.tree.leaves(params))
  with pytest.raises(ValueError, match=rf"hessian_k = {n + 1} exceeds the {n} parameters"):
    terrain.basin_report(loss_fn, params, jax.random.key(0), hessian_k=n + 1,
                         hessian_iters=n + 5)
  for bad, error, rule in ((-2, ValueError, "must be >= 1, got -2"),
                           (0, ValueError, "must be >= 1, got 0"),
                           (2.5, TypeError, "must be an integer or None, got 2.5"),
                           (True, TypeError, "must be an integer or None, got True")):
    with pytest.raises(error, match=f"batch_size {rule}"):
      terrain.hessian_trace(loss_fn, params, jax.random.key(0), 2, batch_size=bad)
  for bad, error, rule in ((float("inf"), ValueError, "must be finite, got inf"),
                           (float("nan"), ValueError, "must be finite, got nan"),
                           (0.0, ValueError, "must be > 0, got 0.0"),
                           (True, TypeError, "must be a number, got True")):
    with pytest.raises(error, match=f"basin_report: slice_range {rule}"):
      terrain.basin_report(loss_fn, params, jax.random.key(0), slice_range=bad)


def test_plots_return_figures_and_check_shapes(tmp_path):
  a = np.linspace(-1, 1, 7)
  fig = terrain.plot_slice_1d(a, {"v1": a ** 2, "v2": 2 * a ** 2}, path=tmp_path / "c.png",
                              title="t")
  assert isinstance(fig, Figure) and len(fig.axes[0].lines) == 3  # two curves + the centre line
  assert (tmp_path / "c.png").read_bytes()[:8] == _PNG
  z = a[:, None] ** 2 + 3 * np.linspace(-2, 2, 5)[None, :] ** 2
  z[0, 0] = np.nan
  fig2 = terrain.plot_slice_2d(a, np.linspace(-2, 2, 5), z, path=tmp_path / "m.png")
  assert isinstance(fig2, Figure) and (tmp_path / "m.png").read_bytes()[:8] == _PNG
  assert isinstance(terrain.plot_sharpness([0.1, 0.2], [0.01, 0.04], [0.0, 0.01]), Figure)
  with pytest.raises(ValueError, match="losses"):
    terrain.plot_slice_1d(a, a[:3])
  with pytest.raises(ValueError, match="losses has shape"):
    terrain.plot_slice_2d(a, a, z)
