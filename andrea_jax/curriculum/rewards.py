"""What ANDREA's bandit is rewarded by: a :class:`Reward`, named by ``curriculum.mixer.reward``.

A reward is two pure functions over the bandit's state (:mod:`andrea_jax.curriculum.bandit`):
``observe`` adds one training step's observation to the open window, ``close`` folds the window
into the discounted statistics at a phase decision. Whatever the reward, the rescaling, the UCB
index and the walk are the same. The built-in ones:

* ``"progress"`` (:func:`progress`): each source's own learning progress, the fall of its loss over
  its tokens between two windows, observed on every batch;
* ``"target_gain"`` (:func:`target_gain`): how fast a step on each source lowers the loss on the
  run's declared target, the signal of the probe of that name (:mod:`andrea_jax.probes.target_gain`);
* the name of any other probe's signal (``probes.<name>``: :mod:`andrea_jax.probes`): that
  signal, each source's mean measurement over the window (:func:`measured`);
* ``"package.module:factory"``: a reward of the user's own, a function with no required argument
  returning a :class:`Reward` (or a :class:`Reward` itself).

A reward that reads probes' signals lists them in ``signals``; the run checks before anything
compiles that some probe measures each.

Writing a reward (a probe's signal, negated: reward the sources it ranks lowest)::

  def lowest(signal: str = "grad_norm") -> Reward:
    def observe(state, obs):
      return bandit.observe_signal(state, -obs.signals[signal])
    return Reward(observe, bandit.close_signal_window, signals=(signal,))
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

from andrea_jax import plugins
from andrea_jax.curriculum import bandit as bandit_lib


class Reward(NamedTuple):
  """How a bandit learns from the run (every function jittable).

  Attributes:
    observe: ``(state, Observation) -> state``: one step added to the open window (the
      observation's ``losses_S``, ``tokens_S``, or a probe's signal in ``signals``).
    close: ``(BanditParams, state) -> state``: at a decision, the window folded into the
      discounted counts ``N`` and sums ``P`` (``hat p = P / N`` is what the index ranks).
    signals: the probes' signals ``observe`` reads (checked against the run's probes).
  """
  observe: Callable[[bandit_lib.BanditState, Any], bandit_lib.BanditState]
  close: Callable[[bandit_lib.BanditParams, bandit_lib.BanditState], bandit_lib.BanditState]
  signals: tuple[str, ...] = ()


def progress() -> Reward:
  """Each source's learning progress on its own batches (:func:`bandit.observe` and
  :func:`bandit.close_window`): nats of loss fallen per token of the source."""
  return Reward(observe=lambda state, obs: bandit_lib.observe(state, obs.losses_S, obs.tokens_S),
                close=bandit_lib.close_window)


def measured(signal: str) -> Reward:
  """A probe's per-source ``signal`` as the reward: the window's mean measurement of each source
  (:func:`bandit.observe_signal`, NaN = not measured), folded in with one count per measurement
  (:func:`bandit.close_signal_window`)."""
  return Reward(observe=lambda state, obs: bandit_lib.observe_signal(state, obs.signals[signal]),
                close=bandit_lib.close_signal_window, signals=(signal,))


def target_gain() -> Reward:
  """The target gain (:mod:`andrea_jax.probes.target_gain`): ``measured("target_gain")``."""
  return measured("target_gain")


BUILTIN: dict[str, Callable[[], Reward]] = {"progress": progress, "target_gain": target_gain}
"""The built-in rewards by name."""


def get(name: str) -> Reward:
  """The reward ``name`` names: a built-in, ``"package.module:factory"``, or a probe's signal.

  A ``ValueError`` starting ``reward = ...`` when it names nothing usable.

  Example:
    >>> get("target_gain").signals
    ('target_gain',)
  """
  where = f"reward = {name!r}"
  if not isinstance(name, str) or not name or name != name.strip():
    raise ValueError(f"{where}: name a built-in reward ({', '.join(BUILTIN)}), a probe's signal "
                     "or 'package.module:factory'")
  if name in BUILTIN:
    return BUILTIN[name]()
  if ":" not in name:
    return measured(name)
  found = plugins.resolve(where, name, BUILTIN, "reward")
  try:
    reward = found if isinstance(found, Reward) else found() if callable(found) else None
  except TypeError as e:   # a function that takes arguments
    raise ValueError(f"{where}: calling it with no arguments failed ({e}); name a Reward or a "
                     "function of no arguments that returns one") from None
  if not isinstance(reward, Reward):
    raise ValueError(f"{where}: {name.partition(':')[2]!r} is not a Reward nor a function "
                     f"returning one (got {type(reward).__name__})")
  return reward
