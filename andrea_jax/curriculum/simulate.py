r"""The curriculum alone, without a model, against a synthetic reward model, in jitted ``lax.scan``.

:class:`SyntheticLosses` stands in for the trainer: each step it draws the batch's sequences from
the mixture (``batch_size`` independent draws over the sources, ``seq_len`` tokens each) and returns
per source the batch-mean loss and the token count (NaN loss for a source with no sequence, as the
trainer's meaningless entries). Source ``s`` has learned ``u_s = sum_t rate_s(t) tokens_s(t)`` and
its loss is

.. math::
   \ell_s = f_s + (\ell^0_s - f_s)\, e^{-u_s} + \frac{\sigma}{\sqrt{m_s}}\,\xi
   \quad\text{(exponential)}, \qquad
   \ell_s = \ell^0_s - u_s + \frac{\sigma}{\sqrt{m_s}}\,\xi \quad\text{(linear)},

with ``m_s`` its number of sequences in the batch and ``xi ~ N(0, 1)``. The rates change abruptly at
``switch_step``. In the linear model the learning progress per token is the constant ``rate_s``
(a stationary bandit); in the exponential one it fades as the source is learned.

:func:`simulate` mirrors the trainer's timing: the weights of step ``t`` are looked up, host-style,
in the schedule read after ``update(t - 1 - decision_lag)``.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from andrea_jax.curriculum import geometries as geometry_lib
from andrea_jax.curriculum import spec as spec_lib
from andrea_jax.curriculum import engine
from andrea_jax.curriculum import registry


@flax.struct.dataclass
class SyntheticLosses:
  """A synthetic reward model (a pytree; see the module docstring for the loss curves).

  Attributes:
    init_loss: ``[S]`` loss before any training, nats.
    floor_loss: ``[S]`` loss reached after infinite training (exponential model), nats.
    rates: ``[2, S]`` learning rates per token before and after ``switch_step`` (exponential: per
      token, in units of ``u``; linear: nats per token).
    switch_step: int32 scalar, first step of the second rates.
    noise: std of one sequence's mean loss, nats.
    batch_size, seq_len: sequences per batch and tokens per sequence (static).
    linear: the linear (stationary-progress) model instead of the exponential one (static).
  """
  init_loss: jax.Array
  floor_loss: jax.Array
  rates: jax.Array
  switch_step: jax.Array
  noise: jax.Array
  batch_size: int = flax.struct.field(pytree_node=False, default=32)
  seq_len: int = flax.struct.field(pytree_node=False, default=1024)
  linear: bool = flax.struct.field(pytree_node=False, default=False)

  def init(self) -> jax.Array:
    """The model's state: ``u``, ``[S]`` float32 zeros."""
    return jnp.zeros_like(self.init_loss, jnp.float32)

  def __call__(self, learned_S: jax.Array, weights_S: jax.Array, step: jax.Array,
               key: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """One batch: ``(new state, losses [S], tokens [S])``."""
    num = weights_S.shape[-1]
    k_draw, k_noise = jax.random.split(key)
    # Inverse-CDF draws (B uniforms, cheaper than Gumbel-max): a source of weight 0 has an empty
    # interval of the cumulative sum and is never drawn.
    cdf_S = jnp.cumsum(weights_S)
    u_B = jax.random.uniform(k_draw, (self.batch_size,)) * cdf_S[-1]
    picks_B = jnp.minimum(jnp.searchsorted(cdf_S, u_B, side="right"), num - 1)
    seqs_S = jnp.sum(jax.nn.one_hot(picks_B, num, dtype=jnp.float32), axis=0)
    tokens_S = seqs_S * self.seq_len
    if self.linear:
      clean_S = self.init_loss - learned_S
    else:
      clean_S = self.floor_loss + (self.init_loss - self.floor_loss) * jnp.exp(-learned_S)
    noise_S = self.noise * jax.random.normal(k_noise, (num,)) / jnp.sqrt(jnp.maximum(seqs_S, 1.0))
    losses_S = jnp.where(seqs_S > 0, clean_S + noise_S, jnp.nan)
    rate_S = jnp.where(step >= self.switch_step, self.rates[1], self.rates[0])
    return learned_S + rate_S * tokens_S, losses_S, tokens_S


def synthetic_losses(num_sources: int, num_steps: int, *, seed: int = 0, batch_size: int = 32,
                     seq_len: int = 1024, noise: float = 0.1, switch_step: int | None = None,
                     unlearnable: int | None = -1) -> SyntheticLosses:
  """The default exponential model: sources with different learning speeds and an abrupt change.

  Rates are log-uniform over a factor 30 around one e-folding per ``num_steps * tokens / S`` tokens;
  at ``switch_step`` (default: 60% of the run) the rates are permuted at random, so that the fastest
  sources change; source ``unlearnable`` (default the last; None for none) has rate 0 throughout.
  """
  rng = np.random.default_rng(seed)
  per_source = num_steps * batch_size * seq_len / num_sources
  rates = np.exp(rng.uniform(np.log(0.2), np.log(6.0), num_sources)) / per_source
  after = rng.permutation(rates)
  rates_2xS = np.stack([rates, after])
  if unlearnable is not None:
    rates_2xS[:, unlearnable] = 0.0
  return SyntheticLosses(
      init_loss=jnp.asarray(rng.uniform(4.0, 6.0, num_sources), jnp.float32),
      floor_loss=jnp.asarray(rng.uniform(1.0, 3.0, num_sources), jnp.float32),
      rates=jnp.asarray(rates_2xS, jnp.float32),
      switch_step=jnp.int32(round(0.6 * num_steps) if switch_step is None else switch_step),
      noise=jnp.float32(noise), batch_size=batch_size, seq_len=seq_len)


@dataclasses.dataclass(frozen=True)
class SimulationResult:
  """A simulated run of steps ``first_step .. first_step + N - 1``.

  Attributes:
    weights: ``[N, S]`` float32, the weights used at each step.
    phase_ids, labels, geometries: ``[N]`` int32: phase number, label (an index into
      ``label_names``, the spec's labels) and geometry of each step.
    lag_consistent: ``[N]`` bool: every schedule snapshot valid for the step (read after
      ``update(t - 1 - decision_lag)`` through ``update(t)``) gave the weights used.
    first_step: the first simulated step.
    state: the curriculum state after the last step (what a checkpoint holds).
    model_state: the reward model's state after the last step.
    reward_model: the reward model used (a resumed simulation reuses it by default).
  """
  weights: np.ndarray
  phase_ids: np.ndarray
  labels: np.ndarray
  geometries: np.ndarray
  lag_consistent: np.ndarray
  first_step: int
  state: engine.CurriculumState
  model_state: Any
  reward_model: Any
  label_names: tuple[str, ...] = ()

  @property
  def next_step(self) -> int:
    return self.first_step + len(self.weights)

  def phases(self, spec: spec_lib.CurriculumSpec | None = None) -> list[dict]:
    """One record per phase seen: ``start``, ``length`` (within the run), ``label`` (e.g.
    ``"random"``, ``"bandit"``), ``geometry`` (its name when ``spec`` is given, else its index)."""
    ids = self.phase_ids
    firsts = np.flatnonzero(np.r_[True, ids[1:] != ids[:-1]])
    ends = np.r_[firsts[1:], len(ids)]
    out = []
    for a, b in zip(firsts, ends):
      g = int(self.geometries[a])
      out.append({"phase": int(ids[a]), "start": int(self.first_step + a), "length": int(b - a),
                  "label": self.label_names[int(self.labels[a])],
                  "geometry": spec.geometry_names[g] if spec is not None else g})
    return out


def _host_queue(state: engine.CurriculumState, lag: int) -> engine.Schedule:
  """The host's view after a (re)start: ``lag + 1`` copies of the current schedule, oldest first."""
  return jax.tree.map(lambda x: jnp.stack([x] * (lag + 1)), engine.schedule(state))


@functools.partial(jax.jit, static_argnames=("num_steps",))
def _scan(spec, state, model, model_state, queue, key, first_step, num_steps):
  """``num_steps`` steps from ``first_step``; ``queue[i]``: the schedule of ``lag + 1 - i`` ago."""

  def body(carry, step):
    state, model_state, queue = carry
    w_S = engine.lookup(jax.tree.map(lambda x: x[0], queue), step)
    slot = (step >= state.starts[1]).astype(jnp.int32)
    ids = (state.phase_ids[slot], state.labels[slot], state.geometries[slot])
    model_state, losses_S, tokens_S = model(model_state, w_S, step, jax.random.fold_in(key, step))
    state = engine.update(spec, state, step, losses_S, tokens_S)
    queue = jax.tree.map(lambda q, x: jnp.concatenate([q[1:], x[None]]), queue,
                         engine.schedule(state))
    # Every snapshot valid for this step (read after update(step - 1 - lag) .. update(step)) must
    # give the weights used: the decision-lag guarantee, checked on every simulated step.
    agree = jax.vmap(lambda w_2xS, s_2: (s_2[0] <= step) & jnp.all(
        engine.lookup(engine.Schedule(w_2xS, s_2), step) == w_S))(queue.weights, queue.starts)
    return (state, model_state, queue), (w_S, *ids, jnp.all(agree))

  steps = first_step + jnp.arange(num_steps, dtype=jnp.int32)
  return jax.lax.scan(body, (state, model_state, queue), steps)


def simulate(spec: spec_lib.CurriculumSpec, key: jax.Array, num_steps: int,
             reward_model: SyntheticLosses | None = None, *,
             resume: SimulationResult | None = None, chunk: int = 1000) -> SimulationResult:
  """Runs the curriculum for ``num_steps`` steps against ``reward_model``, in jitted ``lax.scan``s.

  The scan is compiled once for ``chunk`` steps (and once more for a remainder) and run
  ``num_steps / chunk`` times, carrying everything between calls, so runs of any length share one
  compilation. Each step looks up its weights in the schedule read after ``update(t - 1 - lag)``,
  as the trainer's host does, then updates the curriculum with the model's losses and tokens.

  Args:
    spec: the curriculum.
    key: the run's key: ``init`` gets ``fold_in(key, 0)``, the model ``fold_in(key, 1)``.
    num_steps: steps to simulate.
    reward_model: any callable pytree ``(model_state, weights [S], step, key) -> (model_state,
      losses [S], tokens [S])`` with an ``init()``; default: the resumed run's, else
      :func:`synthetic_losses` over ``num_steps``.
    resume: continue after this result from its curriculum and model states only, as a resumed
      trainer does (the first lookups use the restored state's schedule). Same ``key`` required.
    chunk: steps per compiled scan.

  Returns:
    A :class:`SimulationResult`.

  Example:
    >>> spec = spec_from_config(curriculum_config())
    >>> r = simulate(spec, jax.random.key(0), 2000)
    >>> r.weights.shape, r.weights[:200, 7:].max(), r.weights[1126:, 8:10].max()
    ((2000, 16), 0.0, 0.0)
  """
  if reward_model is None:
    reward_model = (resume.reward_model if resume is not None
                    else synthetic_losses(spec.num_sources, num_steps))
  if resume is None:
    state = engine.init(spec, jax.random.fold_in(key, 0))
    model_state, first = reward_model.init(), 0
  else:
    state, model_state, first = resume.state, resume.model_state, resume.next_step
  queue = _host_queue(state, spec.decision_lag)
  key_model = jax.random.fold_in(key, 1)
  outs, done = [], 0
  while done < num_steps:
    n = min(chunk, num_steps - done)
    (state, model_state, queue), out = _scan(spec, state, reward_model, model_state, queue,
                                             key_model, jnp.int32(first + done), n)
    outs.append(out)
    done += n
  w, ids, labels, geoms, agree = (np.concatenate([np.asarray(o[i]) for o in outs]) for i in range(5))
  return SimulationResult(weights=w, phase_ids=ids, labels=labels, geometries=geoms,
                          lag_consistent=agree, first_step=first, state=state,
                          model_state=model_state, reward_model=reward_model,
                          label_names=spec.labels)


SEED_TRIANGLE = ("hermes3-general", "gutenberg", "dictionary")
"""The source document's three-source example: H, G, D."""


def seed_triangle_spec(config: ml_collections.ConfigDict | None = None
                       ) -> spec_lib.CurriculumSpec:
  """The seed's worked example as a curriculum: ``H >= 0.5``, ``D <= 0.25`` over (H, G, D).

  Its region is the quadrilateral (1,0,0), (0.5,0.5,0), (0.5,0.25,0.25), (0.75,0,0.25). The phase
  and bandit fields come from ``config`` (a ``curriculum`` section; default
  :func:`curriculum_config`).
  """
  c = ml_collections.ConfigDict((config or spec_lib.curriculum_config()).to_dict())
  # The run's mixer over the example's three sources (a per-source weight of another source
  # is dropped; one of the three keeps its weight).
  c.mixer = registry.for_sources(c.mixer, SEED_TRIANGLE)
  g = ml_collections.ConfigDict()
  g.seed_example = geometry_lib.geometry("seed_example", 0, floors={"hermes3-general": 0.5},
                                       ceilings={"dictionary": 0.25}, sources=SEED_TRIANGLE)
  c.geometries = g
  return spec_lib.spec_from_config(c, sources=SEED_TRIANGLE)
