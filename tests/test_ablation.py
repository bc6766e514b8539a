"""The vmapped ablation engine against each variant trained alone with the normal train step."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from andrea_jax import ablation
from andrea_jax import data as data_lib
from andrea_jax import evaluate as eval_lib
from andrea_jax import runconfig
from andrea_jax import step as step_lib
from andrea_jax import train
from andrea_jax.generate import generate
from andrea_jax.sources import SOURCES, WARMUP_SOURCES
from tests.util import small_run_config

STEPS = 6
VARIANTS = [
    {"seed": 0, "warmup_steps": 0, "peak_lr": 3e-3},                     # v1: the peak at step 0
    {"seed": 1, "warmup_steps": 4, "peak_lr": 1e-2, "init_std": 0.05},  # a ramp, another init
]


def _config():
  c = small_run_config(num_steps=STEPS)
  c.eval.update(sample_tokens=6, prompts=("The ", "Q: A"))   # one length: one compilation
  # 7 sources x 3 = 21 held-out rows, over the 16-row micro-batch: the variants' evaluation runs
  # in chunks (of 11 rows), as the trainer's does.
  c.eval.update(sequences_per_source=3)
  return c


@pytest.fixture(scope="module")
def result(data_cache):
  return ablation.train_variants(_config(), VARIANTS, STEPS, eval_every=3, chunk_steps=3)


def _hand_lr(t, peak, warmup, total, min_ratio=0.1):
  """Linear warmup then cosine to ``min_ratio * peak``, written out."""
  if t < warmup:
    return peak * t / warmup
  p = (t - warmup) / (total - warmup)
  return min_ratio * peak + (1 - min_ratio) * peak * 0.5 * (1 + math.cos(math.pi * p))


@pytest.mark.slow
def test_each_vmapped_variant_equals_the_variant_trained_alone(result):
  """Variant k of the one program = the normal jitted train step with variant k's config, fed the
  same batches: the sampler with the base seed and the first phase's mixture (1/7 on each of the
  seven warmup sources of the v2 geometry)."""
  base = _config()
  weights = np.array([1 / 7 if s in WARMUP_SOURCES else 0.0 for s in SOURCES])
  np.testing.assert_allclose(result.mixture, np.broadcast_to(weights, (STEPS, 16)), atol=1e-6)
  spec = data_lib.data_spec(base.data, base.sources)
  tokenizer = spec.tokenizer
  data = data_lib.open_training_data(spec, required=WARMUP_SOURCES, progress=False)
  sampler = data_lib.MixtureSampler(data, seq_len=base.data.seq_len,
                                    global_batch_size=base.data.global_batch_size, seed=base.seed)
  batches = [sampler.batch(t, weights) for t in range(STEPS)]
  # One evaluator (its compiled loss) for both variants: it only needs the model's shape.
  evaluator = eval_lib.HeldOut(runconfig.build(base), data, tokenizer)
  for k, v in enumerate(VARIANTS):
    c = _config()
    c.seed = v["seed"]
    c.optim.warmup_steps = v["warmup_steps"]
    c.optim.peak_lr = v["peak_lr"]
    c.model.init_std = v.get("init_std", c.model.init_std)
    run = runconfig.build(c)
    state = jax.jit(lambda: train.init_state(run, train.run_keys(c.seed)))()
    step_fn = step_lib.jit_step(run.step)
    losses, lrs, evals = [], [], []
    for t, batch in enumerate(batches):
      state, m = step_fn(state, {key: jnp.asarray(x) for key, x in batch.items()})
      losses.append(float(m["loss"]))
      lrs.append(float(m["lr"]))
      if t + 1 in (3, 6):
        evals.append(evaluator.losses(state.params))
    np.testing.assert_allclose(result.loss[k], losses, rtol=2e-5, err_msg=f"variant {k}")
    np.testing.assert_allclose(result.lr[k], lrs, rtol=1e-6)
    np.testing.assert_allclose(
        result.lr[k], [_hand_lr(t, v["peak_lr"], v["warmup_steps"], STEPS) for t in range(STEPS)],
        rtol=1e-5)
    assert result.eval_steps.tolist() == [3, 6]
    for e, ev in enumerate(evals):
      for name in WARMUP_SOURCES:
        loss = ev[name]
        assert result.eval_loss[k, e, SOURCES.index(name)] == pytest.approx(loss, rel=2e-5)
    for a, b in zip(jax.tree.leaves(result.variant_params(k)), jax.tree.leaves(state.params)):
      # Batched and unbatched matmuls sum in different orders; Adam's normalised update turns
      # rounding in a near-zero gradient into a difference, here far below one step (lr = 1e-2).
      np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)
  # Sources outside the mixture are not evaluated.
  assert np.isnan(result.eval_loss[:, :, SOURCES.index("dictionary")]).all()
  assert result.eval_sources == WARMUP_SOURCES
  assert result.skipped.tolist() == [0, 0]


@pytest.mark.slow
def test_samples_are_each_variants_own_generation(result):
  """The vmapped sampling equals :func:`generate` on one variant's parameters, with the key the
  result documents (``fold_in(fold_in(eval key, num_steps), prompt index)``)."""
  c = _config()
  run = runconfig.build(c)
  tokenizer = data_lib.load_tokenizer(c.data.tokenizer)
  key = jax.random.fold_in(jax.random.fold_in(train.run_keys(c.seed)["eval"], STEPS), 1)
  prompt = np.array([[tokenizer.eod_id, *tokenizer.encode("Q: A")]], np.int32)
  k = 1
  toks = generate(result.variant_params(k), run.model, jnp.asarray(prompt), key,
                  max_new_tokens=6, temperature=c.eval.temperature, top_k=c.eval.top_k)
  new = np.asarray(toks)[0, prompt.shape[1]:]
  sample = result.samples[k][1]
  assert sample["prompt"] == "Q: A"
  assert sample["sampled"] == tokenizer.decode([t for t in new.tolist() if t != tokenizer.eod_id])
  # repetition of 6 tokens, by hand: the share of repeated n-grams for n = 2, 3, 4.
  shares = []
  for n in (2, 3, 4):
    grams = [tuple(new[i:i + n]) for i in range(len(new) - n + 1)]
    shares.append(sum(g in grams[:i] for i, g in enumerate(grams)) / len(grams))
  assert sample["sampled_repetition"] == pytest.approx(np.mean(shares))
  assert result.repetition("greedy").shape == (2, 2)
  assert result.collapsed().shape == (2,)


@pytest.mark.slow
def test_loop_baseline_trains_the_same_variant(result):
  slow = ablation.loop_baseline(_config(), VARIANTS[1:], STEPS, eval_every=3, chunk_steps=3,
                                samples=False)
  np.testing.assert_allclose(slow.loss, result.loss[1:], rtol=2e-5)
  np.testing.assert_allclose(slow.eval_loss, result.eval_loss[1:], rtol=2e-5)
  assert result.method == "vmap" and slow.method == "loop"
  assert result.compile_seconds > 0 and slow.run_seconds > 0
  assert "seed=1 warmup=4 lr=0.01 init=0.05" in result.table()


@pytest.mark.parametrize("variants, match", [
    ([{"warmup": 3}], r"variants\[0\] has unknown field\(s\) \['warmup'\]"),
    ([{}, {"warmup_steps": 9}],
     r"variants\[1\].warmup_steps must be <= 6, got 9 \(num_steps = 6\)"),
    ([{"warmup_steps": -1}], r"variants\[0\].warmup_steps must be >= 0, got -1 \(num_steps = 6\)"),
    ([{"peak_lr": -1.0}], r"variants\[0\].peak_lr must be > 0, got -1.0"),
    ([{"init_std": float("inf")}], r"variants\[0\].init_std must be finite, got inf"),
    ([{"seed": 2**31}], r"variants\[0\].seed must be below 2\*\*31 \(an int32\), got 2147483648"),
    ([{"seed": -1}], r"variants\[0\].seed must be >= 0, got -1"),
    ([], "non-empty list"),
])
def test_bad_variants_are_rejected_with_the_field(variants, match):
  with pytest.raises(ValueError, match=match):
    ablation.resolve_variants(_config(), variants, STEPS)


@pytest.mark.parametrize("variants, match", [
    ([{"seed": 1.0}], r"variants\[0\].seed must be an integer, got 1.0"),
    ([{"warmup_steps": True}], r"variants\[0\].warmup_steps must be an integer, got True"),
    ([{"peak_lr": "1e-3"}], r"variants\[0\].peak_lr must be a number, got '1e-3'"),
    ([{"init_std": np.bool_(True)}], r"variants\[0\].init_std must be a number, got "),
])
def test_a_variant_value_of_the_wrong_type_is_a_type_error(variants, match):
  with pytest.raises(TypeError, match=match):
    ablation.resolve_variants(_config(), variants, STEPS)


def test_numpy_numbers_are_variants_too_and_each_warmup_must_fit_a_wsd_decay():
  got = ablation.resolve_variants(_config(), [{"warmup_steps": w, "seed": np.int64(1),
                                               "peak_lr": np.float32(1e-3)}
                                              for w in np.arange(0, 6, 2)], STEPS)
  assert [v.warmup_steps for v in got] == [0, 2, 4] and {v.seed for v in got} == {1}
  assert all(type(v.warmup_steps) is int and type(v.seed) is int for v in got)
  # The rule one run obeys: a wsd decay must fit after the warmup. A variant may not escape it.
  c = _config()
  c.optim.schedule, c.optim.decay_steps = "wsd", STEPS - 2
  with pytest.raises(ValueError, match=r"optim.decay_steps = \d+ does not fit after the warmup "
                                       r"\(variants\[1\].warmup_steps = 3\)"):
    ablation.resolve_variants(c, [{"warmup_steps": 2}, {"warmup_steps": 3}], STEPS)


def test_a_mixture_of_the_wrong_shape_is_rejected_before_training():
  with pytest.raises(ValueError, match=r"mixture must have shape \[16\] or \[num_steps = 6, 16\]"):
    ablation.train_variants(_config(), [{}], STEPS, mixture=np.ones(3) / 3)
  with pytest.raises(ValueError, match="sum to 1"):
    ablation.train_variants(_config(), [{}], STEPS, mixture=np.full(16, 0.1))


@pytest.mark.slow
def test_the_logged_rate_after_skipped_steps_is_the_rate_applied(data_cache):
  # A rate of 1e30 from step 0 (no warmup): the weights leave float32's range and the later steps
  # are skipped. A skipped step does not advance the schedule's count, so every step after the
  # first finite one logs the rate of the count reached, as the normal train step does.
  c = small_run_config(num_steps=4)
  c.eval.sample_tokens = 0
  variants = [{"warmup_steps": 0, "peak_lr": 1e30}]
  got = ablation.train_variants(c, variants, 4, samples=False, chunk_steps=4)
  want = ablation.loop_baseline(c, variants, 4, samples=False, chunk_steps=4)
  assert int(got.skipped[0]) == int(want.skipped[0]) >= 2
  np.testing.assert_allclose(got.lr, want.lr, rtol=1e-6)
  finite_steps = 4 - int(got.skipped[0])
  # By hand: the cosine rate at the count of finite steps before each step (one here: step 0).
  assert finite_steps == 1
  hand = [_hand_lr(t, 1e30, 0, 4) for t in (0, 1, 1, 1)]
  np.testing.assert_allclose(got.lr[0], hand, rtol=1e-6)


def test_a_wsd_sweep_is_checked_on_its_own_warmups_not_the_config_files():
  # The config's warmup (5) leaves no room for a 3-step decay in 6 steps; the variants' (0, 2) do.
  c = _config()
  c.optim.update(schedule="wsd", decay_steps=3, warmup_steps=5)
  resolved, base, _, _ = ablation.engine._setup(c, [{"warmup_steps": 0}, {"warmup_steps": 2}],
                                                STEPS, 0, 3, None)
  assert [v.warmup_steps for v in resolved] == [0, 2] and base.optim.warmup_steps == 0
  # A variant that sets no warmup takes the config's, and is told where the value came from.
  c = _config()
  c.optim.warmup_steps = 20
  with pytest.raises(ValueError, match=r"variants\[0\].warmup_steps must be <= 6, got 20 "
                                       r"\(num_steps = 6; optim.warmup_steps: the variant sets "
                                       r"none\)"):
    ablation.resolve_variants(c, [{"seed": 1}], STEPS)


@pytest.mark.slow
def test_counts_may_be_numpy_integers_and_rates_must_fit_float32(data_cache):
  c = _config()
  with pytest.raises(ValueError, match=r"variants\[0\].peak_lr must be within float32's normal "
                                       r"range \[1.175e-38, 3.403e\+38\], got 1e\+39 \(the "
                                       r"precision the step runs in\)"):
    ablation.resolve_variants(c, [{"peak_lr": 1e39}], STEPS)
  with pytest.raises(ValueError, match="chunk_steps must be >= 1, got 0"):
    ablation.train_variants(c, [{}], np.int64(STEPS), chunk_steps=0)
  r = ablation.train_variants(c, [{"warmup_steps": 0}], np.int64(2), eval_every=np.int64(0),
                              samples=False)
  assert r.loss.shape == (1, 2)
  with pytest.raises(ValueError, match="final_loss: last must be >= 1, got 0"):
    r.final_loss(last=0)
  np.testing.assert_allclose(r.final_loss(last=1), r.loss[:, -1])
