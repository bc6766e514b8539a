"""In-step measurements: the run's probes, each a per-source signal with a cadence and rows of its own.

A probe (:class:`Probe`) measures one number per source inside the jitted training step, every
``every`` steps, on rows the host adds to the batch (levanter's ``JitCallback`` under
``lax.cond``). Its signal goes to every mixer in ``Observation.signals[<name>]`` (the bandit's
reward ``"target_gain"`` reads the probe of that name; a mixer of one's own may read any) and to
``metrics.jsonl`` as ``<name>/<source>`` at the steps it measured. The config holds one section per
probe under ``probes``, keyed by the probe's name, made from its factory's typed arguments as a
mixer's section is (:mod:`andrea_jax.plugins`)::

  probes.target_gain.name = "target_gain"      # a built-in probe, or "package.module:factory"
  probes.target_gain.every = 4                 # ... the factory's own arguments

A factory takes the run's :class:`ProbeEnv` first, then its keyword arguments, and returns a
:class:`Probe` (or ``None``: off). The built-in one is :func:`target_gain.probe`. A probe of one's
own is one module; :func:`probe_config` makes its section::

  c.probes.grad_cos = probes.probe_config("mystudy.probes:grad_cos", every=10)
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

import ml_collections

from andrea_jax import checks, plugins
from andrea_jax.probes import target_gain
from andrea_jax.probes.interface import (At, HostRows, MakeSampler, Probe, ProbeContext, ProbeEnv,
                                         is_due, rows_key, split)
from andrea_jax.sources import SOURCES

BUILTIN: dict[str, Callable[..., Probe | None]] = {"target_gain": target_gain.probe}
"""The built-in probes' names and factories."""

# Log records already use these prefixes: a probe's ``<name>/<source>`` keys must not collide.
RESERVED = ("loss", "weight", "share", "curriculum", "cliff", "eval", "data", "samples", "probes")

__all__ = ["At", "BUILTIN", "HostRows", "MakeSampler", "Probe", "ProbeContext", "ProbeEnv",
           "build", "is_due", "probe_config", "probes_config", "rows_key", "split", "target_gain"]


def _factory(where: str, name) -> Callable[..., Probe | None]:
  made = plugins.resolve(f"{where}.name = {name!r}", name, BUILTIN, "probe")
  if not callable(made):
    raise ValueError(f"{where}.name = {name!r}: not a function returning a Probe")
  return made


def probe_config(name: str = "target_gain", sources: Sequence[str] = SOURCES,
                 **overrides) -> ml_collections.ConfigDict:
  """The section of probe ``name`` (a built-in or ``"package.module:factory"``): ``name`` and the
  factory's arguments at their defaults (``overrides`` replace some).

  Example:
    >>> probe_config("target_gain", every=4).target_rows
    8
  """
  try:
    return plugins.section(name, _factory("probes", name), sources, skip=1, **overrides)
  except ValueError as e:
    raise ValueError(f"probe {e}") from None


def probes_config(sources: Sequence[str] = SOURCES) -> ml_collections.ConfigDict:
  """The ``probes`` section of a run: the target gain's, off (``every = 0``)."""
  c = ml_collections.ConfigDict()
  c.target_gain = probe_config("target_gain", sources)
  return c


def build(section: ml_collections.ConfigDict, env: ProbeEnv) -> tuple[Probe, ...]:
  """The run's probes from its ``probes`` section, those that measure (a factory may return
  ``None``: off), each named by its key. ``env`` is the run's (its ``name`` is replaced by each
  key). Every error names ``probes.<name>.<field>`` and the value."""
  out = []
  for key in section.keys():
    where = f"probes.{key}"
    if not re.fullmatch(r"[A-Za-z][A-Za-z0-9_]*", key) or key in RESERVED:
      raise ValueError(f"{where}: a probe's name is its signal's name in the logs "
                       f"(<name>/<source>): letters, digits and '_', not one of {RESERVED}")
    sub = section[key]
    if not isinstance(sub, (ml_collections.ConfigDict, dict)) or "name" not in sub:
      raise ValueError(f"{where} must be a section with a name (make it with "
                       f"andrea_jax.probes.probe_config(name)), got {sub!r}")
    name = sub["name"]
    make = _factory(where, name)
    kwargs = plugins.keyword_arguments(
        where, name, make, {k: v for k, v in dict(sub).items() if k != "name"}, env.sources,
        skip=1, hint=f": make the section with andrea_jax.probes.probe_config({name!r})",
        what="probe")
    made = plugins.call(where, name, make, kwargs, env._replace(name=key))
    if made is not None:
      out.append(_checked(where, name, made, env.devices)._replace(name=key))
  return tuple(out)


def _checked(where: str, name: str, made, devices: int) -> Probe:
  if not isinstance(made, Probe):
    raise ValueError(f"{where}.name = {name!r}: the factory returned {type(made).__name__}, not "
                     "a Probe (or None)")
  checks.integer(f"{where}: the probe's every", made.every, minimum=1)
  for group, rows in dict(made.rows).items():
    need = f"a group needs a positive multiple of the {devices} devices"
    rows = checks.integer(f"{where}: the rows of row group {group!r}", rows, minimum=1, hint=need)
    if rows % devices:
      raise ValueError(f"{where}: row group {group!r} has {rows} rows; {need}")
  if not (callable(made.draw) and callable(made.measure)):
    raise ValueError(f"{where}: the probe's draw and measure must be functions")
  return made
