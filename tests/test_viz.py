"""The notebooks' figures: ternary geometry, attention maps, grouped ablation curves."""

import math

import numpy as np
import pytest
from matplotlib.collections import PathCollection
from matplotlib.patches import Polygon
from matplotlib.quiver import Quiver

from andrea_jax import viz


def _shoelace(xy):
  x, y = xy[:, 0], xy[:, 1]
  return 0.5 * abs(np.dot(x, np.roll(y, -1)) - np.dot(y, np.roll(x, -1)))


def test_region_polygon_is_ordered_whatever_the_vertex_order():
  # The seed's quadrilateral H >= 0.5, D <= 0.25: in (G, D) coordinates its corners are (0, 0),
  # (0.5, 0), (0.25, 0.25), (0, 0.25), area 3/32 of the (G, D) half unit square's 1/2, i.e. 3/16
  # of the triangle; the drawn triangle (side 1) has area sqrt(3)/4.
  corners = np.array([[1, 0, 0], [0.5, 0.5, 0], [0.5, 0.25, 0.25], [0.75, 0, 0.25]])
  for perm in ([0, 1, 2, 3], [2, 0, 3, 1], [3, 1, 0, 2]):
    fig = viz.figure(4, 4)
    ax = viz.ternary_axes(fig.add_subplot())
    viz.ternary_region(ax, corners[perm])
    region = [p for p in ax.patches if isinstance(p, Polygon)][-1]
    xy = region.get_xy()[:-1]           # closed path: the last point repeats the first
    assert _shoelace(xy) == pytest.approx(3 / 16 * math.sqrt(3) / 4, rel=1e-9)


def test_ternary_axes_draw_the_unit_triangle_and_names():
  fig = viz.figure(4, 4)
  ax = viz.ternary_axes(fig.add_subplot(), ("H", "G", "D"), grid=0.5)
  outline = ax.patches[0].get_xy()[:3]
  np.testing.assert_allclose(outline, [[0, 0], [1, 0], [0.5, math.sqrt(3) / 2]], atol=1e-12)
  assert [t.get_text() for t in ax.texts] == ["H", "G", "D"]
  assert len(ax.lines) == 3              # one iso-line per coordinate at 0.5


def test_scatter_and_arrows_use_barycentric_coordinates():
  fig = viz.figure(4, 4)
  ax = viz.ternary_axes(fig.add_subplot(), grid=0)
  viz.ternary_scatter(ax, [[0, 0, 1], [0.5, 0.5, 0]])
  pts = [c for c in ax.collections if isinstance(c, PathCollection)][-1].get_offsets()
  np.testing.assert_allclose(pts, [[0.5, math.sqrt(3) / 2], [0.5, 0]], atol=1e-12)
  # From (1, 0, 0) to (0, 1, 0): one unit to the right; from (0, 0, 1) to (0.5, 0.5, 0): straight
  # down by the height.
  viz.ternary_arrows(ax, [[1, 0, 0], [0, 0, 1]], [[0, 1, 0], [0.5, 0.5, 0]])
  q = [c for c in ax.collections if isinstance(c, Quiver)][-1]
  np.testing.assert_allclose(np.c_[q.U, q.V], [[1, 0], [0, -math.sqrt(3) / 2]], atol=1e-12)
  with pytest.raises(ValueError, match="same shape"):
    viz.ternary_arrows(ax, [[1, 0, 0]], [[0, 1, 0], [0, 0, 1]])


def test_attention_maps_one_panel_per_head():
  w = np.tril(np.ones((5, 5)))
  w = w / w.sum(-1, keepdims=True)
  fig = viz.attention_maps(np.stack([w, w, w]), boundaries=[2], cols=2, title="t")
  shown = [ax for ax in fig.axes if ax.images]
  assert len(shown) == 3
  np.testing.assert_allclose(shown[0].images[0].get_array(), np.sqrt(w))
  masks = viz.attention_maps(np.stack([w > 0]).astype(float), power=1, label="may attend")
  np.testing.assert_array_equal(masks.axes[0].images[0].get_array(), (w > 0).astype(float))
  with pytest.raises(ValueError, match=r"\[H, T, S\]"):
    viz.attention_maps(w)


def test_smoothing_is_a_trailing_mean():
  np.testing.assert_allclose(viz._smooth(np.array([[1.0, 2, 3, 4]]), 2), [[1, 1.5, 2.5, 3.5]])
  np.testing.assert_allclose(viz._smooth(np.array([[1.0, np.nan, 3, 5]]), 3), [[1, 1, 2, 4]])
  # An infinity (a diverged variant) is left out like a NaN, not spread over the rest of the curve.
  diverged = np.array([[2.0, 2, np.inf, 2, 2, 2, 2, 2]])
  np.testing.assert_allclose(viz._smooth(diverged, 2), [[2.0] * 8])
  np.testing.assert_allclose(viz._smooth(np.array([[1.0, -np.inf, 3, 5]]), 3), [[1, 1, 2, 4]])


def test_grouped_curves_draw_the_group_means():
  curves = np.array([[4.0, 3, 2], [6, 5, 4], [1, 1, 1]])
  fig = viz.grouped_curves(curves, [0, 0, 10], group_name="warmup")
  ax = fig.axes[0]
  thick = [ln for ln in ax.lines if ln.get_linewidth() == 2.0]
  assert [ln.get_label() for ln in thick] == ["warmup = 0 (2 runs)", "warmup = 10 (1 runs)"]
  np.testing.assert_allclose(thick[0].get_ydata(), [5, 4, 3])
  np.testing.assert_allclose(thick[1].get_ydata(), [1, 1, 1])
  with pytest.raises(ValueError, match="K = len"):
    viz.grouped_curves(curves, [0, 1])


def test_grouped_values_mean_line():
  fig = viz.grouped_values([0, 0, 20, 20, 20], [2.0, 4.0, 1.0, 2.0, 3.0], xlabel="warmup")
  line = fig.axes[0].lines[0]
  np.testing.assert_allclose(line.get_xdata(), [0, 20])
  np.testing.assert_allclose(line.get_ydata(), [3.0, 2.0])
  assert [t.get_text() for t in fig.axes[0].get_xticklabels()] == ["0", "20"]


def test_sharpness_curves_plot_each_point():
  fig = viz.sharpness_curves([0.01, 0.1], {"a": ([0.001, 0.1], [0.0, 0.01]),
                                           "b": ([0.002, 0.3], [0.0, 0.02])})
  ax = fig.axes[0]
  assert ax.get_xscale() == "log"
  assert [t.get_text() for t in ax.get_legend().get_texts()] == ["a", "b"]
  np.testing.assert_allclose(ax.lines[0].get_ydata(), [0.001, 0.1])
  with pytest.raises(ValueError, match="curve 'a'"):
    viz.sharpness_curves([0.01, 0.1], {"a": ([1.0], [0.0])})


def test_run_timeline_reads_the_records():
  records = [{"step": t, "loss": 2.0 - 0.1 * t, "loss/repo-docs": 1.0 + t,
              "weight/repo-docs": 0.5 if t < 2 else 0.0} for t in range(4)]
  fig = viz.run_timeline(records, sources=["repo-docs"], score=[0, 1, 9, 2], threshold=6,
                         marks=[(2, "flag")])
  top, weights, score = fig.axes
  np.testing.assert_allclose(top.lines[0].get_ydata(), [2.0, 1.9, 1.8, 1.7])
  np.testing.assert_allclose(top.lines[1].get_ydata(), [1, 2, 3, 4])
  np.testing.assert_allclose(weights.lines[0].get_ydata(), [0.5, 0.5, 0, 0])
  np.testing.assert_allclose(score.lines[0].get_ydata(), [0, 1, 9, 2])
  assert len(viz.run_timeline(records).axes) == 2


def test_run_timeline_takes_every_line_of_metrics_jsonl():
  # As the trainer writes it: step records, then an evaluation record (no 'loss') every 2 steps.
  lines = []
  for t in range(4):
    lines.append({"step": t, "loss": 3.0 - 0.5 * t, "weight/chat": 0.25 * t})
    if t % 2 == 1:
      lines.append({"step": t + 1, "eval/mean_loss": 9.0, "eval/loss/chat": 9.0, "samples": []})
  for given in (lines, iter(lines)):  # a list, or lines read lazily
    top, weights = viz.run_timeline(given, sources=["chat"], expected=[3, 3, 2, 2]).axes
    np.testing.assert_allclose(top.lines[0].get_xdata(), [0, 1, 2, 3])
    np.testing.assert_allclose(top.lines[0].get_ydata(), [3.0, 2.5, 2.0, 1.5])
    np.testing.assert_allclose(top.lines[1].get_ydata(), [3, 3, 2, 2])
    np.testing.assert_allclose(weights.lines[0].get_ydata(), [0, 0.25, 0.5, 0.75])
  with pytest.raises(ValueError, match=r"expected must have one value per training record, "
                                       r"shape \(4,\), got \(6,\)"):
    viz.run_timeline(lines, expected=np.zeros(6))
  with pytest.raises(ValueError, match="no training record .* among its 2"):
    viz.run_timeline([r for r in lines if "loss" not in r])
