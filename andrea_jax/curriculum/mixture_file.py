"""A mixture schedule read from a JSON file: a fitted mixture is an input, not a code path.

A mixture fitted elsewhere (on small proxy runs, by hand, by another tool) reaches a run as a
file; reading it gives ordinary ``curriculum.geometries`` entries, so the weights are recorded
with every checkpoint's config and each one can still be overridden on the command line. Two
shapes are read:

* a **schedule**, the run cut into parts by start (a fraction of ``train.num_steps`` in
  ``[0, 1)``, or ``start_step`` in steps), each on the full simplex holding its ``mixture``
  (relative weights by source name; a source left out gets 0) or, without one, left to the run's
  mixer (``"static"``: ``curriculum.mixer.mixture``, uniform by default)::

    {"schedule": [{"start": 0.0, "mixture": {"code": 3, "docs": 1}}, {"start": 0.5}]}

* **weights per geometry**, held in the named geometries of the config's own curriculum (their
  floors, ceilings and start steps unchanged)::

    {"geometries": {"v2_firehose": {"chat": 2, "gutenberg": 1}}}

Both may carry ``"sources"``, the list of names the weights were fitted for: a run over other
sources is refused rather than silently reweighted.

Example (``experiments/mixture_file.py`` does this for the main job)::

  curriculum.set_mixer(c, "static")
  c.curriculum.geometries = read_mixture_file("fit.json", num_steps=c.train.num_steps,
                                              sources=SOURCES)
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence

import ml_collections

from andrea_jax import checks, storage
from andrea_jax.curriculum.geometries import geometry
from andrea_jax.sources import source_key


def _fail(path: str, message: str) -> ValueError:
  return ValueError(f"mixture file {path}: {message}")


def _mixture(path: str, where: str, given, sources: Sequence[str]) -> dict[str, float]:
  """``{source: weight}`` over all ``sources`` (0 for those left out), checked."""
  if not isinstance(given, Mapping) or not given:
    raise _fail(path, f"{where} must map source names to weights, got {given!r}")
  out = {s: 0.0 for s in sources}
  for name, w in given.items():
    if name not in out:
      raise _fail(path, f"{where} names {name!r}, not a source of the run "
                        f"({', '.join(sources)})")
    out[name] = checks.number(f"mixture file {path}: {where}.{name}", w, low=0)
  if not any(out.values()):
    raise _fail(path, f"{where}: every weight is 0")
  return out


def _start(path: str, where: str, part, num_steps: int) -> int:
  if "start_step" in part:
    return checks.integer(f"mixture file {path}: {where}.start_step", part["start_step"],
                          minimum=0, maximum=num_steps - 1,
                          hint=f"a step of the run: train.num_steps = {num_steps}")
  if "start" not in part:
    raise _fail(path, f"{where} needs start (a fraction of the run in [0, 1)) or start_step")
  frac = checks.number(f"mixture file {path}: {where}.start", part["start"], low=0, high=1,
                       high_open=True, hint="a fraction of the run; or give start_step")
  return round(frac * num_steps)


def read_mixture_file(path: str | os.PathLike, *, num_steps: int, sources: Sequence[str],
                      geometries: ml_collections.ConfigDict | None = None
                      ) -> ml_collections.ConfigDict:
  """``curriculum.geometries`` from the mixture file at ``path`` (see the module docstring).

  Args:
    path: the JSON file.
    num_steps: the run's ``train.num_steps`` (fractions of the run become start steps).
    sources: the run's sources, in order.
    geometries: the config's geometries, needed by (and only by) a file of weights per geometry.

  Raises ``ValueError`` (``TypeError`` for a value of the wrong type) naming the file and the
  entry at fault.
  """
  path = os.fspath(path)
  try:
    with open(path) as f:
      content = json.load(f)
  except OSError as e:
    raise _fail(path, f"cannot be read ({e.strerror or e})") from None
  except json.JSONDecodeError as e:
    raise _fail(path, f"is not JSON ({e})") from None
  if not isinstance(content, dict) or ("schedule" in content) == ("geometries" in content):
    raise _fail(path, "must be an object with either 'schedule' or 'geometries'")
  fitted = content.get("sources")
  if fitted is not None and list(fitted) != list(sources):
    raise _fail(path, f"was written for the sources {list(fitted)}, the run has {list(sources)}")
  if "geometries" in content:
    return _per_geometry(path, content["geometries"], geometries, sources)
  parts = content["schedule"]
  if not isinstance(parts, list) or not parts or not all(isinstance(p, dict) for p in parts):
    raise _fail(path, "schedule must be a non-empty list of objects")
  out = ml_collections.ConfigDict()
  starts = []
  for i, part in enumerate(parts):
    where = f"schedule[{i}]"
    start = _start(path, where, part, num_steps)
    if starts and start <= starts[-1]:
      raise _fail(path, f"{where} starts at step {start}, not after the part before ({starts[-1]})")
    if not starts and start != 0:
      raise _fail(path, f"{where}, the first part, starts at step {start}, not 0")
    starts.append(start)
    mixture = part.get("mixture")
    out[f"part{i}"] = geometry(
        f"part{i}", start, sources=sources,
        mixture=None if mixture is None else _mixture(path, f"{where}.mixture", mixture, sources))
  return out


def _per_geometry(path: str, given, geometries: ml_collections.ConfigDict | None,
                  sources: Sequence[str]) -> ml_collections.ConfigDict:
  if geometries is None:
    raise _fail(path, "holds weights per geometry: pass the config's geometries to place them")
  if not isinstance(given, Mapping) or not given:
    raise _fail(path, f"geometries must map geometry names to mixtures, got {given!r}")
  out = ml_collections.ConfigDict(geometries.to_dict())
  for name, mixture in given.items():
    if name not in out:
      raise _fail(path, f"names geometry {name!r}; the config's are {sorted(out.keys())}")
    weights = _mixture(path, f"geometries.{name}", mixture, sources)
    out[name].mixture = ml_collections.ConfigDict({source_key(s): w for s, w in weights.items()})
  return out


def write_mixture_file(path: str | os.PathLike, schedule: Sequence[tuple[float, Mapping | None]],
                       sources: Sequence[str], **extra) -> None:
  """Writes a schedule ``[(start fraction, {source: weight} or None), ...]`` for
  :func:`read_mixture_file`, with ``sources`` and any ``extra`` fields (how it was fitted, say)."""
  content = {"sources": list(sources),
             "schedule": [{"start": float(start), **({} if m is None else {"mixture": dict(m)})}
                          for start, m in schedule], **extra}
  storage.atomic_write(os.fspath(path), json.dumps(content, indent=1),
                       "the mixture file was not written; nothing else changed")
