r"""Does the curriculum help? One small model, one run length, one config per mixing strategy (arm).

  .venv/bin/python -m study.mixing.compare     # the default arms, seeds 0, 1, 2, into runs/compare_mixers
  python -m andrea_jax.main --config=study/mixing/arms.py:andrea --workdir=runs/cmp/andrea

The arm is the part after the colon (default ``andrea``); all arms share the model, the data, the
number of steps and tokens, the optimizer and the evaluation (every 50 steps, the same 32 held-out
windows of every source):

* ``uniform``: the static uniform mixture, 1/16 on each of the 16 sources for the whole run (one
  full-simplex geometry). The baseline.
* ``static``: strategy "static" under ANDREA's three geometries: the uniform mixture *projected onto
  each region* (1/7 on the warmup sources, then 1/16, then hermes3-general 0.7 and 0.3/13 on the 13
  other allowed sources). It isolates what the geometries alone cost or bring.
* ``andrea``, ``bandit_only``, ``random_only``, ``exp3``: the four mixing strategies under ANDREA's
  three geometries scaled to the run (v2 warmup on the seven warmup sources for the first 10%, the
  firehose, the v3 polish from 56%).
* ``<strategy>_full`` (e.g. ``andrea_full``, ``exp3_full``): the same strategy on the full simplex
  for the whole run, like ``uniform``: the mixer without the geometries.
* ``elastic`` and ``elastic_andrea``: the elastic mixer (:mod:`andrea_jax.curriculum.elastic`:
  shares in proportion to each source's log-time learning rate, part kept uniform), on the full
  simplex and under ANDREA's geometries; ``elastic_early`` fits from step 25 instead of 100.
* the attempts the measurements suggested: ``andrea_floor``, ``bandit_only_floor`` (the full
  simplex with every source at 1/32 or more), ``andrea_floor_slow`` (and a bandit discount of
  0.999), ``andrea_floor_eta03`` (eta 0.03), ``andrea_floor_random50`` (half the phases random),
  ``andrea_floor_log_rate`` (bandit phases ranking sources by their log-time learning rate instead
  of the per-token learning progress: the reward definition); an oracle's choice,
  ``uniform_noise_capped`` (uniform with the noise source ``extra-06`` capped at 1/32 by hand);
  and probes fitted after the fact, ``static_fitted`` (:data:`FITTED_MIXTURE`),
  ``static_fitted_full`` (the fitted elasticities alone, no uniform half), ``static_fitted_25``
  and ``static_fitted_75`` (a quarter and three quarters fitted, the rest uniform),
  ``static_refitted`` (:data:`REFITTED_MIXTURE`, the same fit on other runs), and
  ``static_fitted_early`` and ``static_fitted_late`` (:data:`FITTED_MIXTURE` for the first or the
  last half of the run, uniform for the other); schedules on the fitted line,
  ``static_fitted_full_early`` and ``static_fitted_75_early`` (lambda 1 or 0.75 for the first
  half, then uniform) and :data:`SCHEDULES` (``static_fitted_75_quarter``, ``_75_3q``,
  ``_decay``); ``elastic_cooldown`` (the elastic mixer, then uniform for the last quarter),
  ``elastic_strong`` (the elastic mixer a quarter uniform) and ``elastic_strong_early`` (that for
  the first half, then uniform).
* the designed proxy (:mod:`study.mixing.proxy`), fixed before its runs: ``probe_00`` to
  ``probe_19`` (:data:`PROBE_MIXTURES`, run at ``TUNING_SEED`` by ``python -m study.mixing.compare
  --fit-proxy``), ``proxy_early`` (the mixture of the elasticities fitted on them,
  :data:`PROXY_ELASTICITY`, for the first half, then uniform) and ``proxy_then_elastic`` (the same
  first half, then the elastic mixer); ``proxy_half_early`` (the fit on the probes' first half
  only, :data:`PROXY_HALF_ELASTICITY`: half the probes' cost); ``proxy_scaled_early`` (the 0.13M
  and 0.85M fits read at the target's size, :data:`SCALED_FITS`) and its mixture sharpened for
  larger targets, ``proxy_scaled_p15_early`` and ``proxy_scaled_p2_early`` (proportional to
  ``max(b, 0.02) ** 1.5`` and ``** 2``: :data:`SHARPEN`); ``proxy_half_p15_early`` (the 0.13M
  half-length fit alone at power 1.5: is the second size needed?); ``proxy_quarter_early`` (the
  probes' first quarter), ``proxy_schedule_early`` and ``proxy_schedule_short_early`` (probes that
  run the schedule they score, 800 and 400 steps), ``proxy_half_4x128_early`` (half-length probes
  of the 4 x 128 model).
* one uniform pilot run in place of the probes (:mod:`study.mixing.influence`, ``python -m
  study.mixing.fit_proxy --method influence``), the same schedule at power 1.5:
  ``influence_pilot_p15_early`` (100 conjugate-gradient iterations per source),
  ``influence_cg10_p15_early`` and ``influence_cg10_gn32_p15_early`` (10 iterations, the
  Gauss-Newton matrix on 128 rows or on one batch: the latter is the fitted schedule of the
  README), ``influence_cg10_gn32_early`` (the same at power 1), ``influence_b8_4x128_p15_early``
  (a 4 x 128 pilot reading 8 batches per measurement).

Hyper-parameters: each tunable arm had the same budget of three settings (:data:`TUNING`, the first
one is the package default), tried at seed ``TUNING_SEED`` (never one of the reported seeds) and
picked on the training split: the equal-weight mean over sources of each source's training loss over
the last 10% of steps (``python -m study.mixing.compare --tune``). The evaluation split never chose
anything. :data:`SELECTED` holds the picks. The pilot recipe's settings are whole arms
(:data:`TUNING_ARMS`: the Gauss-Newton rows and the power, which earlier runs had picked on
held-out loss, picked again the same way, ``--tune influence``).

Hardware: a 2-core x86 CPU. A run is 30-110 s depending on the machine's load; the default
comparison (8 arms x 3 seeds, then the step timing) about 25 min on free cores.

Results: ``study/mixing/README.md`` (the summary and its commands) and ``study/mixing/LOG.md``
(every table, with the commands that made it).
"""

from collections.abc import Sequence

import ml_collections

from andrea_jax import config as config_lib
from andrea_jax.curriculum import andrea_geometries, geometry, set_mixer
from study.mixing import proxy
from andrea_jax.sources import SOURCES

NUM_STEPS = 800              # ANDREA's 200K-step regimes shrink to start at 0, 80 and 450
EVAL_EVERY = 50
TUNING_SEED = 100

# name -> (curriculum strategy, geometry schedule[, extra overrides]); "andrea" = the three
# regimes, "full" = the whole simplex from step 0, "floor" = the whole simplex with a floor of 1/32
# (one row of a batch) on every source, "noise_cap" = the whole simplex with extra-06 <= 1/32.
ARMS = {
    "uniform": ("static", "full"),
    "static": ("static", "andrea"),
    "andrea": ("andrea", "andrea"),
    "bandit_only": ("bandit_only", "andrea"),
    "random_only": ("random_only", "andrea"),
    "exp3": ("exp3", "andrea"),
    # The mixers without the geometries.
    "andrea_full": ("andrea", "full"),
    "bandit_only_full": ("bandit_only", "full"),
    "random_only_full": ("random_only", "full"),
    "exp3_full": ("exp3", "full"),
    # Every source kept at 1/32 or more (a source's final loss follows its share of the batches),
    # and a bandit that averages its noisy learning progress over the whole run (discount 0.999).
    "andrea_floor": ("andrea", "floor"),
    "bandit_only_floor": ("bandit_only", "floor"),
    "andrea_floor_slow": ("andrea", "floor", {"bandit.discount": 0.999}),
    "andrea_floor_eta03": ("andrea", "floor", {"eta": 0.03}),
    # Not a strategy, an oracle's choice: the uniform mixture with the noise source capped at 1/32
    # (by hand, knowing it is noise). How much can moving weight away from it gain at all?
    "uniform_noise_capped": ("static", "noise_cap"),
    # The share of random phases, the last knob the issue names (0 is bandit_only_floor, 0.25
    # andrea_floor), and the reward: bandit phases ranking sources by their log-time learning rate.
    "andrea_floor_random50": ("andrea", "floor", {"random_share": 0.5}),
    "andrea_floor_log_rate": ("andrea", "floor",
                              {"strategy": "study.mixing.mixers:andrea_log_rate"}),
    # The elastic mixer (shares in proportion to each source's log-time learning rate, half kept
    # uniform), on the full simplex and under ANDREA's geometries.
    "elastic": ("elastic", "full"),
    "elastic_andrea": ("elastic", "andrea"),
    # The timing probes found the gain is made early: the elastic mixer fitting from step 25 on,
    # not 100 (its package default).
    "elastic_early": ("elastic", "full", {"elastic.burn_in": 25}),
    # Not a strategy, a probe: one static mixture fitted after the fact (see FITTED_MIXTURE).
    "static_fitted": ("static", "fitted"),
    "static_fitted_full": ("static", "fitted_full"),
    "static_refitted": ("static", "refitted"),
    "static_fitted_25": ("static", "fitted_25"),
    "static_fitted_75": ("static", "fitted_75"),
    # Probes of timing: the same fitted mixture for one half of the run, uniform for the other. Can
    # a schedule over time go past the best static mixture (the ceiling the sweep measured)?
    "static_fitted_early": ("static", "fitted_early"),
    "static_fitted_late": ("static", "fitted_late"),
    # The gain is made early and a source's final loss follows its recent share: the stronger
    # mixtures of the fitted line (lambda 1 and 0.75, which alone tie or trail lambda 0.5) for the
    # first half only, uniform after. Does a schedule over time pass the static ceiling that way?
    "static_fitted_full_early": ("static", "fitted_full_early"),
    "static_fitted_75_early": ("static", "fitted_75_early"),
    # How long to hold it, and a stepwise relaxation to uniform (SCHEDULES).
    "static_fitted_75_quarter": ("static", "fitted_75_quarter"),
    "static_fitted_75_3q": ("static", "fitted_75_3q"),
    "static_fitted_decay": ("static", "fitted_decay"),
    # The best schedule found above ends on uniform for the last quarter: the same cooldown for an
    # online mixer (the elastic mixer on the full simplex for 3/4 of the run, then uniform).
    "elastic_cooldown": ("elastic", "cooldown"),
    # The best static schedule's shape, online: the elastic mixer a quarter uniform (as lambda
    # 0.75), throughout or for the first half and then uniform.
    "elastic_strong": ("elastic", "full", {"elastic.uniform_mix": 0.25}),
    "elastic_strong_early": ("elastic", "cooldown_half", {"elastic.uniform_mix": 0.25}),
    # The proxy recipe, fixed before its runs (study.mixing.proxy): the mixture
    # proportional to the elasticities fitted on the designed probes (PROXY_ELASTICITY) for the
    # first half, then uniform.
    "proxy_early": ("static", "proxy_early"),
    # The same proxy mixture for the first half, then the elastic mixer (its default settings) on
    # the full simplex: the proxy where the online estimates are worst (early), the online mixer
    # where they are good (its gain at 0.85M is made after the first quarter). Its fit observes
    # every step, the first half too.
    "proxy_then_elastic": ("elastic", "proxy_early"),
    # Half the probes' cost: the same probes stopped at half the run (their first 400 steps are a
    # 400-step probe of this schedule), fitted on their training losses over steps 300-400
    # (PROXY_HALF_ELASTICITY), the same schedule.
    "proxy_half_early": ("static", "proxy_half_early"),
    # A quarter of the probes' cost: the probes stopped at a quarter of the run, fitted on their
    # training losses over steps 150-200 (PROXY_QUARTER_ELASTICITY; fit_proxy --stop 0.25), the same
    # schedule. How short can the probes be?
    "proxy_quarter_early": ("static", "proxy_quarter_early"),
    # Probes that run the schedule they score: each probe mixture for the first half, then uniform,
    # fitted on the losses after the switch (PROXY_SCHEDULE_ELASTICITY), the same schedule. The
    # static probes measure what a share buys while it is held; the metric is a loss after the
    # switch. Whole probes (the cost of proxy_early).
    "proxy_schedule_early": ("static", "proxy_schedule_early"),
    # The same probes as 400-step runs (PROXY_SCHEDULE_SHORT_ELASTICITY): half the cost.
    "proxy_schedule_short_early": ("static", "proxy_schedule_short_early"),
    # Past 1M parameters the 0.13M proxy gives 16-18%, against 19-21% at 0.13-0.85M: does a proxy
    # nearer the target's size help? The half-length fit on 4 x 128 probes
    # (PROXY_HALF_4X128_ELASTICITY), and the 2 x 64 and 4 x 128 fits read at the target's size
    # (SCALED_FITS), the same schedule. proxy_scaled_early reads the size when its config is made:
    # python -m study.mixing.compare --layers/--d-model re-read it (fit_to_model); --config.model.*
    # overrides of python -m andrea_jax.main come after, so there it stays at the 2 x 64 size.
    "proxy_half_4x128_early": ("static", "proxy_half_4x128_early"),
    "proxy_scaled_early": ("static", "proxy_scaled_early"),
    # Past 1M parameters the arms fall faster than uniform after the switch (they catch up on the
    # sources they starved), and on the hindsight fit the stronger mixture won at 0.85M (lambda 1
    # against 0.75) where the weaker one won at 0.13M: a larger model can afford to starve the
    # low-elasticity sources harder for the first half. The scaled fit's mixture sharpened,
    # proportional to b ** 1.5 and b ** 2 (SHARPEN), the same schedule. Fixed before its runs.
    "proxy_scaled_p15_early": ("static", "proxy_scaled_p15_early"),
    "proxy_scaled_p2_early": ("static", "proxy_scaled_p2_early"),
    # Power 1.5 took 2.76M from 17.8% to 19.6% with fits at two sizes; the 0.85M probes cost 3.1
    # runs of that target. The same power on the 0.13M half-length fit alone (a sixth of the
    # probes' cost in parameters x tokens), the same schedule: is the second size needed? At the
    # 2 x 64 size it is proxy_scaled_p15_early itself. Fixed before its runs.
    "proxy_half_p15_early": ("static", "proxy_half_p15_early"),
    # One uniform pilot run in place of the 20 probes: the truncated-horizon influence of its
    # state at steps 300-375 (study/mixing/gradient_probe.py --method influence, the tuning seed 100,
    # 0.13M; r 0.93 with the half-length probes' power-1.5 mixture), the same schedule and power as
    # proxy_half_p15_early. Fixed before its runs.
    "influence_pilot_p15_early": ("static", "influence_pilot_p15_early"),
    # The same pilot as the command gives it (python -m study.mixing.fit_proxy --method influence):
    # 10 conjugate-gradient iterations per source, the Gauss-Newton matrix on all 128 rows or on
    # the first batch's 32 (study/mixing/influence_pilot.py; r 0.992 and 0.976 with the 100-iteration
    # pilot's power-1.5 mixture). Fixed before their runs.
    "influence_cg10_p15_early": ("static", "influence_cg10_p15_early"),
    "influence_cg10_gn32_p15_early": ("static", "influence_cg10_gn32_p15_early"),
    # The pilot at 0.85M (the 4 x 128 model, seed 100), twice the gradient rows (--batches 8), the
    # matrix on 128 rows: r 0.94 with the 0.85M probes' power-1.5 mixture, past the 0.9 its rule
    # (study/mixing/influence_pilot.py) asked. For the 4 x 128 model. Fixed before its runs.
    "influence_b8_4x128_p15_early": ("static", "influence_b8_4x128_p15_early"),
    # The one-batch pilot's mixture at power 1 (proportional to max(b, 0.02)): the third setting
    # of the recipe's tuning budget (TUNING_ARMS).
    "influence_cg10_gn32_early": ("static", "influence_cg10_gn32_early"),
}

# The designed probes of study.mixing.proxy: 20 static mixtures over the 16 sources, each
# source high (4x a low source's share) in half of them, in a two-level orthogonal array. Run at
# TUNING_SEED on the 2-layer model and fitted on their training losses by
# ``python -m study.mixing.compare --fit-proxy``; never on a reported seed.
PROBE_MIXTURES = proxy.probe_mixtures(len(SOURCES))
PROBE_ARMS = tuple(f"probe_{k:02d}" for k in range(len(PROBE_MIXTURES)))
ARMS.update({arm: ("static", arm) for arm in PROBE_ARMS})

# A static mixture fitted after the fact, from the *training* losses of the full-simplex arms above
# (seeds 0-2): per source, the late training loss minus uniform's regressed on the log of the share
# the source got, ``loss ~ c - b log share`` (``python -m study.mixing.compare --fit-elasticity``); the
# mixture is half ``b / sum b`` and half uniform. Source order of ``andrea_jax.sources.SOURCES``. It
# answers: is there a mixture that beats uniform on this testbed at all, and by how much?
# FITTED_ELASTICITY comes from the first comparison's 27 runs (andrea_full ... uniform_noise_capped,
# made with the sampler's former largest-remainder rounding, commit 2d32d83); REFITTED_ELASTICITY
# from the 33 runs of the same arms (and the two new floor attempts) with the current sampler: the
# same method on other runs, to show how much the fit itself varies. ``static_fitted_full`` uses
# ``FITTED_ELASTICITY`` alone (no uniform half).
FITTED_ELASTICITY = (0.033, 0.030, 0.066, 0.039, 0.073, 0.039, 0.064, 0.095, 0.014, 0.171, 0.022,
                     0.022, 0.194, 0.043, 0.074, 0.020)
REFITTED_ELASTICITY = (0.016, 0.018, 0.076, 0.092, 0.071, 0.066, 0.063, 0.073, 0.041, 0.121,
                       0.021, 0.046, 0.138, 0.043, 0.092, 0.022)
# The fitted static mixtures: kind -> (elasticities, lambda), the mixture being ``lambda b / sum b
# + (1 - lambda) / 16``. fitted_25 and fitted_75 bracket fitted's lambda = 0.5: how far can a
# static mixture on this line go at all (the upper bound a mixer that converges to one would meet)?
FITTED_KINDS = {"fitted": (FITTED_ELASTICITY, 0.5), "fitted_25": (FITTED_ELASTICITY, 0.25),
                "fitted_75": (FITTED_ELASTICITY, 0.75), "fitted_full": (FITTED_ELASTICITY, 1.0),
                "refitted": (REFITTED_ELASTICITY, 0.5)}


def fitted_line(elastic: Sequence[float], lam: float) -> tuple[float, ...]:
  """The mixture ``lambda b / sum b + (1 - lambda) / S`` for elasticities ``b``, in source order."""
  return tuple(lam * b / sum(elastic) + (1 - lam) / len(SOURCES) for b in elastic)


def fitted_mixture(kind: str) -> tuple[float, ...]:
  """The static mixture of a fitted kind of :data:`FITTED_KINDS`, in source order."""
  return fitted_line(*FITTED_KINDS[kind])


# Schedules over time on the fitted line: kind -> ((start as a fraction of the run, lambda), ...),
# each lambda held from its start to the next (lambda 0 is the full simplex, where the static
# strategy holds uniform). Probes of the timing results, not strategies: lambda 0.75 for the first
# half was the best two-part schedule (``fitted_75_early``), so how long should it last, and does a
# mixture that relaxes to uniform step by step do better?
SCHEDULES = {"fitted_75_quarter": ((0.0, 0.75), (0.25, 0.0)),
             "fitted_75_3q": ((0.0, 0.75), (0.75, 0.0)),
             "fitted_decay": ((0.0, 1.0), (0.25, 0.75), (0.5, 0.5), (0.75, 0.25))}

# The elasticities (nats per unit of log share) fitted on the PROBE_ARMS' training losses
# (``python -m study.mixing.compare --fit-proxy``), source order; ``proxy_early`` holds
# ``elasticity_mixture(PROXY_ELASTICITY)`` (lambda 1) for the first half, uniform after. Fitted on
# the 20 probes (638 s of 2-layer runs in all), R^2 0.78 to 0.98 except oasst, gutenberg and
# repo-docs, whose own share made no difference (b about 0, R^2 0.01 to 0.15).
PROXY_ELASTICITY = (0.156, 0.132, 0.140, 0.180, 0.259, -0.006, -0.009, 0.372, -0.022, 0.443, 0.172,
                    0.301, 0.662, 0.199, 0.251, 0.072)
# The same fit on the probes' first half only (training losses over steps 300-400; the last 10%,
# steps 360-400, leaves some sources without a logged loss): half the probes' cost. R^2 0.62 to
# 0.99 except oasst (0.26) and repo-docs (0.00); Pearson r 0.96 with PROXY_ELASTICITY's mixture.
PROXY_HALF_ELASTICITY = (0.089, 0.057, 0.109, 0.073, 0.200, 0.015, -0.052, 0.297, -0.002, 0.372,
                         0.232, 0.180, 0.593, 0.217, 0.205, 0.081)
# The same on the probes' first quarter (training losses over steps 150-200), fixed before its runs:
# R^2 0.74 to 0.98 on 11 sources; Pearson r 0.82 with PROXY_HALF_ELASTICITY's mixture. Early in
# the run the fast-learned sources weigh more (extra-02, -04 and the noise extra-06 double their b).
PROXY_QUARTER_ELASTICITY = (0.022, -0.029, 0.153, 0.086, 0.144, 0.039, 0.078, 0.158, 0.020, 0.571,
                            0.181, 0.367, 0.474, 0.337, 0.248, 0.169)
# Fitted on probes run as the target runs (``fit_proxy --probes=schedule --stop 1 --late 0.25``):
# each probe's mixture for the first half, uniform after, fitted on the training losses over steps
# 600-800, all under uniform batches: what a source's early share still buys once the batches are
# balanced, the quantity the schedule is scored on. Fixed before its runs. Smaller effects than the
# static probes' (b 0.01 to 0.21) and noisier (R^2 0.14 to 0.91, 0.72 or more on 5 sources); Pearson
# r 0.95 with PROXY_HALF_ELASTICITY's mixture, the floor (0.02 in units of b) binding on 5 sources.
PROXY_SCHEDULE_ELASTICITY = (0.026, 0.018, 0.027, 0.031, 0.080, 0.015, 0.009, 0.083, 0.011, 0.169,
                             0.040, 0.076, 0.205, 0.078, 0.066, 0.010)
# The same probes scaled down to half the cost, fixed before its runs: 400-step runs
# (``--config.train.num_steps=400``; learning-rate schedule, switch and window all halved), each
# mixture for 200 steps, uniform after, fitted on steps 300-400. R^2 0.68 to 0.96 on 8 sources;
# Pearson r 0.89 with PROXY_SCHEDULE_ELASTICITY's mixture; like the quarter-length static probes it
# credits the sources learned fast (extra-04 up 1.5x, repo-docstrings down to 0.6x).
PROXY_SCHEDULE_SHORT_ELASTICITY = (0.005, 0.009, 0.024, 0.017, 0.039, 0.008, 0.002, 0.064, 0.013,
                                   0.095, 0.054, 0.076, 0.226, 0.120, 0.076, 0.019)
# The half-length fit again, on probes of the 4 x 128 model (850,688 parameters, 6.6x the 2-layer
# model's 128,768): ``python -m study.mixing.fit_proxy --config=study/mixing/arms.py:uniform
# --config.seed=100 --config.model.num_layers=4 --config.model.d_model=128
# --config.model.num_heads=4 --config.model.d_mlp=512 --workdir=runs/fit_proxy_half_4x128``
# (20 x 400 steps). Fixed before its runs. R^2 0.72 to 0.99 except oasst (0.45), gutenberg (0.12)
# and repo-docs (0.35); Pearson r 0.94 with PROXY_HALF_ELASTICITY's mixture. The larger model gains
# more from most sources' rows (b x1.15-2.8 on the prose, x1.4 on dictionary, x1.6 on
# repo-docstrings), the same from extra-02, -03 and -05, less from extra-01 and the noise extra-06.
PROXY_HALF_4X128_ELASTICITY = (0.150, 0.100, 0.125, 0.194, 0.309, 0.042, -0.015, 0.428, 0.040,
                               0.585, 0.171, 0.189, 0.621, 0.278, 0.204, 0.064)
# The truncated-horizon influence b_s = w_s g_s^T (G + P^{-1} / sum lr)^{-1} g_s of the uniform run
# at the tuning seed, averaged over steps 300, 325, 350 and 375 (``study/mixing/gradient_probe.py --method
# influence``; 128 rows of training batches per step, CG): the probes' elasticities from one
# pilot run's gradients, in the same units (r 0.90 with PROXY_HALF_ELASTICITY).
INFLUENCE_PILOT_ELASTICITY = (0.046, 0.056, 0.068, 0.095, 0.170, 0.053, 0.031, 0.245, 0.184,
                              0.391, 0.190, 0.154, 0.446, 0.176, 0.259, 0.027)
# The same from ``python -m study.mixing.fit_proxy --method influence`` (``study/mixing/influence_pilot.py``,
# the same pilot and steps): 10 CG iterations per source with the Gauss-Newton matrix on all 128
# rows (the command's default), and on the first batch's 32 rows (the gradients on all 128).
INFLUENCE_CG10_ELASTICITY = (0.035, 0.037, 0.042, 0.069, 0.130, 0.038, 0.024, 0.162, 0.095,
                             0.233, 0.133, 0.094, 0.278, 0.117, 0.153, 0.020)
INFLUENCE_CG10_GN32_ELASTICITY = (0.047, 0.044, 0.060, 0.098, 0.253, 0.046, 0.031, 0.245, 0.159,
                                  0.406, 0.208, 0.144, 0.515, 0.160, 0.215, 0.031)
# The same command at 0.85M (``--config.model.num_layers=4 --config.model.d_model=128
# --config.model.num_heads=4 --config.model.d_mlp=512 --batches 8 --gn_rows 128``).
INFLUENCE_B8_4X128_ELASTICITY = (0.087, 0.064, 0.101, 0.154, 0.214, 0.107, 0.072, 0.249, 0.131,
                                 0.432, 0.182, 0.251, 0.420, 0.135, 0.221, 0.070)
PROXY_FITS = {"proxy_early": PROXY_ELASTICITY, "proxy_half_early": PROXY_HALF_ELASTICITY,
              "proxy_quarter_early": PROXY_QUARTER_ELASTICITY,
              "proxy_schedule_early": PROXY_SCHEDULE_ELASTICITY,
              "proxy_schedule_short_early": PROXY_SCHEDULE_SHORT_ELASTICITY,
              "proxy_half_4x128_early": PROXY_HALF_4X128_ELASTICITY,
              "proxy_half_p15_early": PROXY_HALF_ELASTICITY,
              "influence_pilot_p15_early": INFLUENCE_PILOT_ELASTICITY,
              "influence_cg10_p15_early": INFLUENCE_CG10_ELASTICITY,
              "influence_cg10_gn32_p15_early": INFLUENCE_CG10_GN32_ELASTICITY,
              "influence_b8_4x128_p15_early": INFLUENCE_B8_4X128_ELASTICITY,
              "influence_cg10_gn32_early": INFLUENCE_CG10_GN32_ELASTICITY}
# Fits at two proxy sizes read at the target's: per source, b as a line in ln(parameters) through
# the 2 x 64 and 4 x 128 half-length fits (proxy.scale_elasticity), at the parameter count of the
# model the arm trains (python -m study.mixing.compare --layers/--d-model included: fit_to_model), the
# same schedule. Fixed before its runs.
_TWO_SIZES = ((128_768, PROXY_HALF_ELASTICITY), (850_688, PROXY_HALF_4X128_ELASTICITY))
SCALED_FITS = {"proxy_scaled_early": _TWO_SIZES, "proxy_scaled_p15_early": _TWO_SIZES,
               "proxy_scaled_p2_early": _TWO_SIZES}
# The power of proxy.elasticity_mixture per proxy kind (1 where absent): the mixture proportional
# to max(b, floor) ** power.
SHARPEN = {"proxy_scaled_p15_early": 1.5, "proxy_scaled_p2_early": 2.0,
           "proxy_half_p15_early": 1.5, "influence_pilot_p15_early": 1.5,
           "influence_cg10_p15_early": 1.5, "influence_cg10_gn32_p15_early": 1.5,
           "influence_b8_4x128_p15_early": 1.5}

FITTED_MIXTURE = fitted_mixture("fitted")
REFITTED_MIXTURE = fitted_mixture("refitted")

# The tuning budget: three settings per strategy with knobs (overrides of the curriculum section),
# the package default first. random_only has no mixer knob; static and uniform none at all.
TUNING = {
    "andrea": ({}, {"random_share": 0.5}, {"eta": 0.1}),
    "bandit_only": ({}, {"eta": 0.1}, {"bandit.discount": 0.98}),
    "exp3": ({}, {"exp3.lr_scale": 0.1}, {"exp3.lr_scale": 0.01}),
    "elastic": ({}, {"elastic.uniform_mix": 0.75}, {"elastic.burn_in": 200}),
}
# The same budget for the pilot recipe (fit_proxy --method influence, then the mixture for the
# first half and uniform): three settings, each a whole arm (the fit and its mixture are the arm's
# geometry, not curriculum fields), the command's defaults first. Its Gauss-Newton rows (one batch
# against 128) and its power (1.5 against 1) were picked on held-out loss of the reported seeds
# (seeds 0-8, and the probes' runs before them); here they are picked the way every other
# strategy's knobs were, at TUNING_SEED on the training split. The pilot itself is the uniform run
# at TUNING_SEED. Fixed before its runs.
TUNING_ARMS = {
    "influence": ("influence_cg10_gn32_p15_early", "influence_cg10_p15_early",
                  "influence_cg10_gn32_early"),
}
# Picked by ``python -m study.mixing.compare --tune influence``: influence_cg10_gn32_p15_early, the
# command's defaults (signal at seed 100: 1.9165 / 1.9657 / 1.9499 for the three, in order).

# The settings picked by `python -m study.mixing.compare --tune` (see the module docstring; signal at seed
# 100: andrea 2.329 / 2.286 / 2.197, bandit_only 2.320 / 2.193 / 2.286, exp3 2.460 / 2.251 / 2.162,
# elastic 1.989 / 2.000 / 1.994 for the three settings above, in order); the _full arms take their
# strategy's pick.
SELECTED = {
    "andrea": {"eta": 0.1},
    "bandit_only": {"eta": 0.1},
    "exp3": {"exp3.lr_scale": 0.01},
    "elastic": {},
}


def geometries(kind: str, num_steps: int = NUM_STEPS,
               num_params: int | None = None) -> ml_collections.ConfigDict:
  """``"andrea"``: the three regimes scaled to ``num_steps``; ``"full"``: the full simplex;
  ``"floor"``: the full simplex with every source at 1/32 or more; ``"noise_cap"``: the full
  simplex with the noise source ``extra-06`` at 1/32 or less; ``"fitted"``: (nearly) the single
  point :data:`FITTED_MIXTURE`; ``"fitted_full"``: (nearly) ``FITTED_ELASTICITY`` normalised;
  ``"refitted"``: (nearly) :data:`REFITTED_MIXTURE`; ``"fitted_25"``, ``"fitted_75"``: a quarter
  and three quarters fitted, the rest uniform (:data:`FITTED_KINDS`); ``"<fitted kind>_early"``,
  ``"<fitted kind>_late"`` (``"fitted_early"``, ``"fitted_full_early"``, ...): that fitted mixture
  for the first (last) half of the run, the full simplex for the other half; one of
  :data:`SCHEDULES`: a schedule on the fitted line; ``"cooldown"`` (``"cooldown_half"``): the full
  simplex for 3/4 (1/2) of the run, then (nearly) the uniform point; ``"probe_<k>"``: the static
  mixture ``PROBE_MIXTURES[k]``; ``"proxy_early"``: the mixture of :data:`PROXY_ELASTICITY` for the
  first half of the run, then uniform; ``"proxy_half_early"``, ``"proxy_quarter_early"``,
  ``"proxy_schedule_early"`` and ``"proxy_schedule_short_early"``: the same with
  :data:`PROXY_HALF_ELASTICITY`, :data:`PROXY_QUARTER_ELASTICITY`,
  :data:`PROXY_SCHEDULE_ELASTICITY`, :data:`PROXY_SCHEDULE_SHORT_ELASTICITY` and
  :data:`PROXY_HALF_4X128_ELASTICITY` (``"proxy_half_p15_early"``: the half-length fit sharpened);
  one of :data:`SCALED_FITS`: the same with the fits read at ``num_params`` (the target model's
  parameter count, required); each sharpened by :data:`SHARPEN` where it is listed."""
  if kind == "andrea":
    return andrea_geometries(num_steps, scale=num_steps / 200_000)
  g = ml_collections.ConfigDict()
  if kind == "full":
    g.full = geometry("full", 0)
  elif kind == "floor":
    g.floor = geometry("floor", 0, floors={s: 1 / 32 for s in SOURCES})
  elif kind == "noise_cap":
    g.noise_cap = geometry("noise_cap", 0, ceilings={"extra-06": 1 / 32})
  elif kind in FITTED_KINDS:
    g[kind] = _point(kind, 0, fitted_mixture(kind))
  elif kind.rpartition("_")[0] in FITTED_KINDS and kind.rpartition("_")[2] in ("early", "late"):
    fitted, _, half_name = kind.rpartition("_")
    half = num_steps // 2
    fitted_start, full_start = (0, half) if half_name == "early" else (half, 0)
    g[fitted] = _point(fitted, fitted_start, fitted_mixture(fitted))
    g.full = geometry("full", full_start)
  elif kind in ("cooldown", "cooldown_half"):
    g.full = geometry("full", 0)
    start = round((0.75 if kind == "cooldown" else 0.5) * num_steps)
    g.cooldown = _point("cooldown", start, (1 / len(SOURCES),) * len(SOURCES))
  elif kind in PROBE_ARMS:
    g.probe = geometry("probe", 0, mixture=dict(zip(SOURCES, PROBE_MIXTURES[int(kind[6:])].tolist())))
  elif kind in PROXY_FITS or kind in SCALED_FITS:
    if kind in PROXY_FITS:
      b = PROXY_FITS[kind]
    elif num_params is None:
      raise ValueError(f"geometry kind {kind!r} needs the target model's num_params")
    else:
      sizes, fits = zip(*SCALED_FITS[kind])
      b = proxy.scale_elasticity(sizes, fits, num_params)
    g = proxy.proxy_schedule(proxy.elasticity_mixture(b, power=SHARPEN.get(kind, 1.0)), num_steps,
                             hold=0.5)
  elif kind in SCHEDULES:
    for k, (start, lam) in enumerate(SCHEDULES[kind]):
      start_step = round(start * num_steps)
      if lam:
        g[f"part{k}"] = _point(f"part{k}", start_step, fitted_line(FITTED_ELASTICITY, lam))
      else:
        g[f"part{k}"] = geometry(f"part{k}", start_step)
  else:
    raise ValueError("geometry kind must be andrea, full, floor, noise_cap, one of "
                     f"{', '.join(FITTED_KINDS)}, or one of them followed by _early or _late, "
                     f"or one of {', '.join(SCHEDULES)}, probe_<k> or one of "
                     f"{', '.join([*PROXY_FITS, *SCALED_FITS])}, got {kind!r}")
  return g


def _point(name: str, start: int, mixture: Sequence[float]) -> ml_collections.ConfigDict:
  """A geometry that is (nearly) the single point ``mixture``: floors at 0.999 of it."""
  return geometry(name, start, floors={s: 0.999 * w for s, w in zip(SOURCES, mixture)})


def arm_settings(arm: str) -> dict:
  """The curriculum overrides of ``arm``: its strategy's pick in :data:`SELECTED`, then its own."""
  strategy, _, *extra = ARMS[arm]
  return {**SELECTED.get(strategy, {}), **(extra[0] if extra else {})}


def apply_overrides(c: ml_collections.ConfigDict, overrides: dict) -> None:
  """Sets ``{"eta": 0.1, "bandit.discount": 0.98}`` in ``c``'s mixer: this study's settings name
  a mixer's arguments under their older sections (``bandit.``, ``exp3.``, ``elastic.``), and
  ``"strategy"`` the mixer itself."""
  overrides = dict(overrides)
  if "strategy" in overrides:
    set_mixer(c, overrides.pop("strategy"))
  for path, value in overrides.items():
    leaf = path.split(".", 1)[1] if path.split(".")[0] in ("bandit", "exp3", "elastic") else path
    if leaf not in c.curriculum.mixer:
      raise ValueError(f"curriculum.{path} is not an argument of mixer "
                       f"{c.curriculum.mixer.name!r}")
    c.curriculum.mixer[leaf] = value


def arm_config(arm: str, *, num_steps: int = NUM_STEPS, settings: dict | None = None,
               seed: int = 0) -> ml_collections.ConfigDict:
  """The run config of ``arm`` with ``settings`` (default: :data:`SELECTED`) and ``seed``."""
  if arm not in ARMS:
    raise ValueError(f"unknown arm {arm!r}; arms are: {', '.join(ARMS)}")
  strategy, kind, *_ = ARMS[arm]
  c = config_lib.base_config()
  c.seed = seed
  c.train.num_steps = num_steps
  c.train.log_every = 10
  c.train.checkpoint_every = 0      # only the final checkpoint
  c.train.progress_bar = False
  c.train.plot = False
  c.eval.every = EVAL_EVERY
  c.eval.sequences_per_source = 32  # 32 windows of 64 tokens per source, the same for every run
  c.eval.sample_tokens = 0          # held-out loss only

  # A 2-layer byte-level decoder (0.1M parameters) on 32 x 64-token batches: ~2K tokens a step,
  # 1.6M tokens a run (100K per source under the uniform mixture).
  c.model.update(num_layers=2, num_heads=2, d_model=64, d_mlp=256, max_len=64)
  c.data.update(seq_len=64, global_batch_size=32)
  c.optim.peak_lr = 2e-3
  c.optim.warmup_steps = 20
  c.optim.weight_decay = 0.1

  set_mixer(c, strategy)
  apply_overrides(c, arm_settings(arm) if settings is None else settings)
  c.cliff.update(window=50, warmup=100, cooldown=50)
  return fit_to_model(c, arm)


def model_params(c: ml_collections.ConfigDict) -> int:
  """The parameter count of ``c``'s model (the padded embedding rows included)."""
  from study.mixing import fit_proxy
  return fit_proxy.model_params(c)


def fit_to_model(c: ml_collections.ConfigDict, arm: str) -> ml_collections.ConfigDict:
  """Sets ``c``'s geometries to ``arm``'s for ``c``'s steps and model; call it again after
  changing the model (only the :data:`SCALED_FITS` arms depend on it)."""
  kind = ARMS[arm][1]
  num_params = model_params(c) if kind in SCALED_FITS else None
  c.curriculum.geometries = geometries(kind, int(c.train.num_steps), num_params)
  return c


def get_config(arm: str | None = None) -> ml_collections.ConfigDict:
  """One arm's run config (``--config=study/mixing/arms.py:<arm>``; default andrea)."""
  return arm_config(arm or "andrea")
