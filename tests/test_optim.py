import jax
import ml_collections
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from andrea_jax import config as config_lib
from andrea_jax import optim


def _cfg(**kw):
  c = config_lib.optim_section()
  c.update(kw)
  return c


def test_cosine_schedule_equals_optax_for_static_values():
  ref = optax.warmup_cosine_decay_schedule(
      init_value=0.0, peak_value=3e-4, warmup_steps=2000, decay_steps=20_000, end_value=3e-5)
  sched = optim.OptimSpec.from_config(_cfg(), 20_000).learning_rate()
  for t in [0, 1, 999, 1999, 2000, 2001, 7000, 15000, 19999, 20000, 25000]:
    np.testing.assert_allclose(float(sched(t)), float(ref(t)), rtol=1e-5, atol=1e-12)


def test_v1_takes_its_first_step_at_the_peak_and_v2_ramps_from_zero():
  v1 = optim.OptimSpec.from_config(_cfg(warmup_steps=0), 200_000).learning_rate()
  v2 = optim.OptimSpec.from_config(_cfg(warmup_steps=2000), 200_000).learning_rate()
  assert float(v1(0)) == pytest.approx(3e-4)
  assert float(v2(0)) == 0.0
  assert float(v2(1000)) == pytest.approx(1.5e-4)   # halfway up the linear ramp
  assert float(v2(2000)) == pytest.approx(3e-4)


def test_wsd_is_flat_then_linear_to_the_floor():
  s = optim.OptimSpec.from_config(_cfg(schedule="wsd", warmup_steps=10, decay_steps=20),
                                  100).learning_rate()
  assert float(s(50)) == pytest.approx(3e-4)
  assert float(s(80)) == pytest.approx(3e-4)
  assert float(s(90)) == pytest.approx(3e-4 - 0.5 * 0.9 * 3e-4)   # halfway down to 10%
  assert float(s(100)) == pytest.approx(3e-5)


def test_warmup_length_may_be_traced_under_vmap():
  warmups = jnp.array([0, 10, 100])
  lrs = jax.vmap(lambda w: optim.warmup_decay(5, peak_lr=1.0, warmup_steps=w, total_steps=1000,
                                              kind="constant"))(warmups)
  np.testing.assert_allclose(np.asarray(lrs), [1.0, 0.5, 0.05], rtol=1e-6)


def test_weight_decay_touches_matrices_only():
  params = {"kernel": jnp.ones((2, 2)), "bias": jnp.ones((2,)), "scale": jnp.ones((2,))}
  tx = optim.OptimSpec.from_config(_cfg(peak_lr=0.1, warmup_steps=0, schedule="constant",
                                 weight_decay=0.5, grad_clip=0.0), 10).transform()
  zero = jax.tree.map(jnp.zeros_like, params)
  updates, _ = tx.update(zero, tx.init(params), params)
  # With zero gradients Adam's direction is 0, so the update is the decay term alone: -lr * wd * p.
  np.testing.assert_allclose(updates["kernel"], -0.1 * 0.5 * np.ones((2, 2)), rtol=1e-6)
  np.testing.assert_allclose(updates["bias"], 0.0)
  np.testing.assert_allclose(updates["scale"], 0.0)


def test_clipping_happens_before_adam():
  # With a large eps Adam's update depends on the gradient's scale, so clipping is visible:
  # the chain must equal plain AdamW fed the clipped gradient g / ||g||.
  kw = dict(peak_lr=0.1, warmup_steps=0, schedule="constant", eps=1.0, weight_decay=0.0)
  tx = optim.OptimSpec.from_config(_cfg(grad_clip=1.0, **kw), 10).transform()
  params = {"a": jnp.zeros((3,))}
  g = {"a": jnp.array([30.0, 40.0, 0.0])}             # norm 50
  got, _ = tx.update(g, tx.init(params), params)
  ref_tx = optax.adamw(0.1, b1=0.9, b2=0.95, eps=1.0, weight_decay=0.0)
  want, _ = ref_tx.update({"a": g["a"] / 50.0}, ref_tx.init(params), params)
  np.testing.assert_allclose(got["a"], want["a"], rtol=1e-6)


@pytest.mark.parametrize("field,value,match", [
    ("peak_lr", float("nan"), "optim.peak_lr must be finite"),
    ("peak_lr", -1e-3, "optim.peak_lr must be > 0"),
    ("warmup_steps", 5000, "optim.warmup_steps = 5000 is longer than the run"),
    ("warmup_steps", -1, "optim.warmup_steps must be >= 0"),
    ("warmup_steps", 2.5, "optim.warmup_steps must be an integer"),
    ("b2", 1.0, r"optim.b2 must be in \[0, 1\)"),
    ("schedule", "linear", "optim.schedule must be one of"),
    ("grad_accum_steps", 0, "optim.grad_accum_steps must be >= 1"),
])
def test_bad_optim_config_names_the_field(field, value, match):
  c = ml_collections.ConfigDict({**_cfg().to_dict(), field: value})
  with pytest.raises((ValueError, TypeError), match=match):
    optim.validate_optim_config(c, total_steps=1000)


@pytest.mark.parametrize("field,value,match", [
    # float32, the step's precision: 1 - 1e-8 rounds to 1.0 (its spacing below 1 is 6e-8).
    ("b2", 0.99999999, r"optim.b2 = 0.99999999 rounds to 1.0 in float32"),
    ("b1", 1 - 2**-26, r"optim.b1 = .* rounds to 1.0 in float32"),
    # below float32's smallest normal number, 2**-126 = 1.1755e-38: flushed to 0
    ("eps", 1e-40, r"optim.eps = 1e-40 is below float32's smallest normal number \(1.175e-38\)"),
    ("peak_lr", 1e-39, r"optim.peak_lr = 1e-39 is below float32's smallest normal"),
    # past float32's largest, (2 - 2**-23) * 2**127 = 3.4028e38: infinite
    ("peak_lr", 1e39, r"optim.peak_lr = 1e\+39 overflows float32 \(largest 3.403e\+38\)"),
    ("weight_decay", 4e38, r"optim.weight_decay = 4e\+38 overflows float32"),
])
def test_values_float32_cannot_hold_are_refused(field, value, match):
  c = ml_collections.ConfigDict({**_cfg().to_dict(), field: value})
  with pytest.raises(ValueError, match=match):
    optim.validate_optim_config(c, total_steps=1000)
  # The edges themselves are fine: the largest b below 1 and the smallest normal eps.
  edge = {"b1": float(np.nextafter(np.float32(1), np.float32(0))), "b2": 0.9999999,
          "eps": 2.0 ** -126, "peak_lr": 2.0 ** -126, "weight_decay": 3.4e38}[field]
  optim.validate_optim_config(ml_collections.ConfigDict({**_cfg().to_dict(), field: edge}),
                              total_steps=200_000)


def test_the_default_wsd_decay_must_fit_after_the_warmup_too():
  # decay_steps = 0 means 20% of the run (20 of 100 steps): after a 90-step warmup the rate would
  # drop from the warmup's 0.99 peak to 0.55 in one step, never holding the peak.
  c = ml_collections.ConfigDict({**_cfg().to_dict(), "schedule": "wsd", "warmup_steps": 90,
                                 "decay_steps": 0})
  with pytest.raises(ValueError, match=r"optim.decay_steps = 0 \(the default: 20% of the run, 20 "
                                       r"steps\) does not fit after the warmup "
                                       r"\(optim.warmup_steps = 90\) in train.num_steps = 100"):
    optim.validate_optim_config(c, total_steps=100)
  c.warmup_steps = 80   # 80 + 20 = 100: fits exactly
  optim.validate_optim_config(c, total_steps=100)
