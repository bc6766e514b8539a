"""The jitted step: a one-step golden test against PyTorch, per-source sums, gradient
accumulation, skipped non-finite steps, the document mask, and the fused loss and lean update
against the earlier forms (one step, and a 300-step run)."""

import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from andrea_jax import convert
from andrea_jax import optim
from andrea_jax import runconfig
from andrea_jax import step as step_lib
from andrea_jax import train
from andrea_jax.model import init_params
from tests.util import small_run_config


def _fixed_batch(rng, B, T, vocab, num_sources):
  """One document per row (no end-of-document inside), as the Hugging Face model sees text."""
  tokens = rng.integers(0, vocab - 1, size=(B, T + 1)).astype(np.int32)
  return {
      "inputs": tokens[:, :-1], "targets": tokens[:, 1:],
      "segment_ids": np.ones((B, T), np.int32),
      "positions": np.broadcast_to(np.arange(T, dtype=np.int32), (B, T)).copy(),
      "source_ids": rng.integers(0, num_sources, size=(B,)).astype(np.int32),
  }



@pytest.mark.slow
def test_one_step_golden_against_pytorch():
  """One AdamW step of ours equals one step of transformers' GPT-2 + torch.optim.AdamW."""
  torch = pytest.importorskip("torch")
  transformers = pytest.importorskip("transformers")
  c = small_run_config()
  c.optim.update(warmup_steps=0, schedule="constant", peak_lr=1e-3, weight_decay=0.1, grad_clip=1.0)
  run = runconfig.build(c)
  mcfg = run.model
  state = jax.jit(lambda: train.init_state(run, train.run_keys(0)))()
  batch = _fixed_batch(np.random.default_rng(0), 4, 32, mcfg.vocab_size, 16)

  # The reference: the same weights in PyTorch, cross-entropy, clip_grad_norm_, AdamW.
  hf = transformers.GPT2LMHeadModel(transformers.GPT2Config(**convert.hf_gpt2_config(mcfg)))
  sd = convert.to_hf_state_dict(state.params, mcfg)
  hf.load_state_dict({k: torch.tensor(np.array(v)) for k, v in sd.items()}, strict=False)
  hf.float().train()
  for m in hf.modules():   # no dropout in ours
    if isinstance(m, torch.nn.Dropout):
      m.p = 0.0
  decay = [p for p in hf.parameters() if p.dim() >= 2]
  no_decay = [p for p in hf.parameters() if p.dim() < 2]
  opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                           {"params": no_decay, "weight_decay": 0.0}],
                          lr=1e-3, betas=(0.9, 0.95), eps=1e-8)
  logits = hf(torch.tensor(batch["inputs"], dtype=torch.long)).logits
  ref_loss = torch.nn.functional.cross_entropy(
      logits.reshape(-1, logits.shape[-1]), torch.tensor(batch["targets"], dtype=torch.long).reshape(-1))
  ref_loss.backward()
  ref_norm = torch.nn.utils.clip_grad_norm_(hf.parameters(), 1.0)
  opt.step()

  step_fn = step_lib.jit_step(run.step)
  new_state, metrics = step_fn(state, {k: jnp.asarray(v) for k, v in batch.items()})
  assert float(metrics["loss"]) == pytest.approx(ref_loss.item(), rel=1e-5)
  assert float(metrics["grad_norm"]) == pytest.approx(float(ref_norm), rel=1e-4)
  ours = convert.to_hf_state_dict(new_state.params, mcfg)
  ref = {k: v.detach().numpy() for k, v in hf.state_dict().items()}
  for name, value in ours.items():
    if name in ref:
      np.testing.assert_allclose(value, ref[name], atol=2e-6, rtol=1e-4, err_msg=name)
  assert int(new_state.step) == 1



def test_per_source_losses_are_segment_means():
  loss = jnp.array([[1.0, 3.0], [2.0, 2.0], [5.0, 7.0]])
  mask = jnp.array([[1.0, 1.0], [1.0, 0.0], [1.0, 1.0]])
  loss_S, tokens_S = step_lib.per_source_sums(loss * mask, mask, jnp.array([2, 0, 2]), 3)
  np.testing.assert_allclose(loss_S, [2.0, 0.0, 16.0])
  np.testing.assert_allclose(tokens_S, [1.0, 0.0, 4.0])



@pytest.mark.slow
def test_gradient_accumulation_equals_the_full_batch():
  c = small_run_config()
  run1 = runconfig.build(c)
  c.optim.grad_accum_steps = 4
  run4 = runconfig.build(c)
  params = init_params(run1.model, jax.random.PRNGKey(1))
  batch = {k: jnp.asarray(v) for k, v in _fixed_batch(np.random.default_rng(1), 8, 32, 257, 16).items()}
  l1, g1, s1, t1 = step_lib.loss_and_grads(run1.step, params, batch)
  l4, g4, s4, t4 = step_lib.loss_and_grads(run4.step, params, batch)
  np.testing.assert_allclose(l1, l4, rtol=1e-6)
  np.testing.assert_allclose(s1, s4, rtol=1e-5)
  np.testing.assert_array_equal(t1, t4)
  for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(g4)):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-7)



@pytest.mark.slow
def test_non_finite_steps_change_nothing_and_halt_after_the_limit():
  c = small_run_config()
  c.train.max_nonfinite_steps = 3
  run = runconfig.build(c)
  state = jax.jit(lambda: train.init_state(run, train.run_keys(0)))()
  # An infinite LayerNorm scale makes the loss NaN: the step must leave params and moments alone.
  params = jax.tree_util.tree_map_with_path(
      lambda p, x: jnp.full_like(x, jnp.inf) if "ln_f" in jax.tree_util.keystr(p) else x,
      state.params)
  state = state.replace(params=params)
  batch = {k: jnp.asarray(v) for k, v in _fixed_batch(np.random.default_rng(2), 4, 32, 257, 16).items()}
  step_fn = jax.jit(lambda s, b: step_lib.train_step(run.step, s, b))
  before = jax.device_get(state)
  halted = []
  for _ in range(4):
    state, m = step_fn(state, batch)
    assert not bool(m["finite"])
    halted.append(int(m["halted_at"]))
  after = jax.device_get(state)
  for a, b in zip(jax.tree.leaves(before.params) + jax.tree.leaves(before.opt_state),
                  jax.tree.leaves(after.params) + jax.tree.leaves(after.opt_state)):
    np.testing.assert_array_equal(a, b)
  assert int(after.step) == 4
  assert halted == [-1, -1, 0, 0]   # the third bad step in a row reaches the limit; the streak began at 0



@pytest.mark.slow
def test_a_non_finite_update_from_a_finite_gradient_changes_nothing():
  # An optimizer whose update overflows (a rate of inf): loss and gradient are finite, the new
  # weights are not. The step is skipped like any non-finite one.
  import dataclasses
  c = small_run_config()
  run = runconfig.build(c)
  cfg = dataclasses.replace(run.step, tx=optax.scale(float("inf")))
  state = jax.jit(lambda: train.init_state(run, train.run_keys(0)))()
  state = state.replace(opt_state=cfg.tx.init(state.params))
  batch = {k: jnp.asarray(v) for k, v in _fixed_batch(np.random.default_rng(2), 4, 32, 257, 16).items()}
  new, m = jax.jit(lambda s, b: step_lib.train_step(cfg, s, b))(state, batch)
  assert np.isfinite(float(m["loss"])) and np.isfinite(float(m["grad_norm"]))
  assert not bool(m["finite"]) and int(new.nonfinite_streak) == 1
  for a, b in zip(jax.tree.leaves(state.params), jax.tree.leaves(new.params)):
    np.testing.assert_array_equal(a, b)
  assert bool(step_lib.all_finite({"a": jnp.ones(3), "b": jnp.zeros((2, 2))}))
  assert not bool(step_lib.all_finite({"a": jnp.ones(3), "b": jnp.array([0.0, jnp.nan])}))



def _batch(segment_ids_BxT):
  B, T = segment_ids_BxT.shape
  tokens = np.random.default_rng(0).integers(1, 256, size=(B, T + 1)).astype(np.int32)
  return {"inputs": jnp.asarray(tokens[:, :-1]), "targets": jnp.asarray(tokens[:, 1:]),
          "segment_ids": jnp.asarray(segment_ids_BxT, jnp.int32),
          "positions": jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (B, T)),
          "source_ids": jnp.zeros((B,), jnp.int32)}


def test_document_mask_only_matters_where_a_row_holds_several_documents():
  run = runconfig.build(small_run_config())
  model = run.step.model
  params = init_params(run.model, jax.random.PRNGKey(0))
  losses = jax.jit(step_lib.token_losses, static_argnums=(0, 3))
  one_doc = _batch(np.ones((2, 16), np.int32))
  a, _ = losses(model, params, one_doc, True)
  b, _ = losses(model, params, one_doc, False)
  np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)   # one document: the masks are equal
  two_docs = _batch(np.repeat([[1] * 8 + [2] * 8], 2, axis=0))
  a, _ = losses(model, params, two_docs, True)
  b, _ = losses(model, params, two_docs, False)
  # The first document never sees the second: equal there; the second sees the first without a mask.
  np.testing.assert_allclose(a[:, :8], b[:, :8], rtol=1e-6, atol=1e-7)
  assert float(jnp.max(jnp.abs(a[:, 8:] - b[:, 8:]))) > 1e-4


def test_document_mask_reaches_the_step_and_is_validated():
  c = small_run_config()
  assert runconfig.build(c).step.document_mask is True
  c.train.document_mask = False
  assert runconfig.build(c).step.document_mask is False
  c = small_run_config()
  with c.unlocked():     # the config's own type check would refuse 1 already: go around it
    del c.train["document_mask"]
    c.train.document_mask = 1
  with pytest.raises(TypeError, match="train.document_mask must be True or False, got 1"):
    runconfig.build(c)


def _padded_batch(seed=3, B=8, T=32):
  """Two documents per row and 5 padding tokens at the end of each (segment id 0)."""
  batch = _fixed_batch(np.random.default_rng(seed), B, T, 257, 16)
  seg = np.repeat([[1] * 13 + [2] * 14 + [0] * 5], B, axis=0).astype(np.int32)
  return {**{k: jnp.asarray(v) for k, v in batch.items()}, "segment_ids": jnp.asarray(seg)}


def _variant(run, fused, lean):
  import dataclasses
  return dataclasses.replace(run.step, lean_update=lean,
                             xent=step_lib.xent_lib.XentConfig() if fused else None)


def test_fused_loss_and_lean_update_give_the_unfused_loss_and_gradient():
  # float32 compute: the fused projection + loss (custom gradient, the count folded into the loss)
  # against the model's logits, optax's loss, and the gradient divided afterwards. The same
  # numbers in another order of operations: float32 rounding, ~1e-7 relative; 1e-5 bounds it.
  run = runconfig.build(small_run_config())
  params = init_params(run.model, jax.random.PRNGKey(4))
  batch = _padded_batch()
  f = jax.jit(step_lib.loss_and_grads, static_argnums=0)
  l0, g0, s0, t0 = f(_variant(run, False, False), params, batch)
  l1, g1, s1, t1 = f(_variant(run, True, True), params, batch)
  assert float(t0.sum()) == 8 * 27                       # the padding does not count
  np.testing.assert_allclose(l1, l0, rtol=1e-6)
  np.testing.assert_allclose(s1, s0, rtol=1e-5)
  np.testing.assert_array_equal(t1, t0)
  for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(g0)):
    assert np.linalg.norm(a - b) <= 1e-5 * np.linalg.norm(b)
  # The padded vocabulary rows (257..383) get no gradient from the fused loss either.
  assert not np.any(np.asarray(g1["wte"]["embedding"])[257:])


def _scalar_sqrts(jaxpr) -> int:
  """How many ``sqrt`` of a scalar the program computes (a global norm ends in one)."""
  n = 0
  for eqn in jaxpr.eqns:
    n += eqn.primitive.name == "sqrt" and eqn.outvars[0].aval.shape == ()
    for sub in jax.extend.core.jaxprs_in_params(eqn.params):
      n += _scalar_sqrts(sub)
  return n


def test_the_lean_step_computes_the_gradient_norm_once_for_the_metric_and_the_clipping():
  run = runconfig.build(small_run_config(optim__grad_clip=1e-3))   # always clips
  state = jax.jit(lambda: train.init_state(run, train.run_keys(0)))()
  batch = _padded_batch()
  count = lambda lean: _scalar_sqrts(jax.make_jaxpr(
      lambda s, b: step_lib.train_step(_variant(run, True, lean), s, b))(state, batch).jaxpr)
  assert count(False) - count(True) == 1
  # The clipping given the norm is optax's clipping, bit for bit; given another norm it clips by
  # that one (so it does not compute its own).
  grads = jax.tree.map(jnp.ones_like, state.params)
  norm = optax.tree_utils.tree_norm(grads)
  clip = optim.clip_by_global_norm(1e-3)
  ref, _ = optax.clip_by_global_norm(1e-3).update(grads, optax.EmptyState())
  given, _ = clip.update(grads, clip.init(grads), grad_norm=norm)
  own, _ = clip.update(grads, clip.init(grads))
  doubled, _ = clip.update(grads, clip.init(grads), grad_norm=2 * norm)
  for a, b, c, d in zip(*map(jax.tree.leaves, (ref, given, own, doubled))):
    np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(a, c)
    np.testing.assert_allclose(d, a / 2, rtol=1e-6)


@pytest.mark.slow
def test_a_tiny_run_with_the_fused_loss_follows_the_unfused_run():
  # 300 steps of the tiny model (2 layers, d 32, B 16 x T 32, AdamW at 3e-3 after a 5-step warmup)
  # on a low-entropy Markov chain it learns, with both step forms from the same state and batches.
  # Their float32 rounding differs (~1e-7 relative per step) and training carries such differences
  # along, mildly amplified: the curves stay within 1e-4 of each other at every step (4e-6 was
  # seen on a 2-core EPYC), while the loss itself falls by more than 2 nats (5.55 to ~1.65).
  run = runconfig.build(small_run_config(num_steps=300))
  rng = np.random.default_rng(0)
  succ = rng.integers(0, 257, size=(257, 3))          # each token has 3 likely successors
  tokens = np.zeros((300, 16, 33), np.int32)
  tokens[:, :, 0] = rng.integers(0, 257, size=(300, 16))
  for t in range(1, 33):
    tokens[:, :, t] = succ[tokens[:, :, t - 1], rng.integers(0, 3, size=(300, 16))]
  B, T = 16, 32
  batches = {"inputs": tokens[:, :, :-1], "targets": tokens[:, :, 1:],
             "segment_ids": np.ones((300, B, T), np.int32),
             "positions": np.broadcast_to(np.arange(T, dtype=np.int32), (300, B, T)),
             "source_ids": rng.integers(0, 16, size=(300, B)).astype(np.int32)}
  state = jax.jit(lambda: train.init_state(run, train.run_keys(0)))()

  def losses(cfg):
    body = lambda s, b: (lambda out: (out[0], out[1]["loss"]))(step_lib.train_step(cfg, s, b))
    return np.asarray(jax.jit(lambda s, bs: jax.lax.scan(body, s, bs)[1])(state, batches))

  fused, unfused = losses(_variant(run, True, True)), losses(_variant(run, False, False))
  assert unfused[0] - unfused[-20:].mean() > 2.0
  np.testing.assert_allclose(fused, unfused, rtol=0, atol=1e-4)


def test_loss_weights_are_the_segment_mask_times_the_loss_mask_by_hand(maybe_jit):
  batch = {"segment_ids": jnp.array([[1, 1, 2, 0], [1, 1, 1, 1]], jnp.int32),
           "loss_mask": jnp.array([[0, 1, 1, 1], [0, 0, 0, 0]], jnp.uint8)}
  np.testing.assert_array_equal(maybe_jit(step_lib.loss_weights)(batch),
                                [[0, 1, 1, 0], [0, 0, 0, 0]])
  without = {"segment_ids": batch["segment_ids"]}
  np.testing.assert_array_equal(maybe_jit(step_lib.loss_weights)(without),
                                [[1, 1, 1, 0], [1, 1, 1, 1]])


@pytest.mark.slow
def test_a_loss_mask_counts_its_targets_only_and_a_row_of_none_counts_zero_not_nan():
  run = runconfig.build(small_run_config())
  params = init_params(run.model, jax.random.PRNGKey(3))
  batch = {k: jnp.asarray(v) for k, v in _fixed_batch(np.random.default_rng(3), 4, 32, 257, 16).items()}
  batch["source_ids"] = jnp.array([0, 5, 5, 9], jnp.int32)
  mask = np.zeros((4, 32), np.uint8)
  mask[0, 10:20] = 1       # row 0: ten counted targets; rows 1 and 2 (source 5): none
  mask[3, :] = 1           # row 3: all
  masked = dict(batch, loss_mask=jnp.asarray(mask))
  every, _ = step_lib.token_losses(run.step.model, params, batch)
  l1, g1, loss_S, tokens_S = step_lib.loss_and_grads(run.step, params, masked)
  every = np.asarray(every, np.float64)
  # By hand: the mean over the 42 counted targets of the unmasked per-token losses.
  want = (every[0, 10:20].sum() + every[3].sum()) / 42
  assert float(l1) == pytest.approx(want, rel=1e-6)
  np.testing.assert_array_equal(np.asarray(tokens_S)[[0, 5, 9]], [10, 0, 32])
  assert np.asarray(tokens_S).sum() == 42
  assert np.isfinite(np.asarray(loss_S)).all() and float(loss_S[5]) == 0.0
  # Every target masked: zero tokens, a loss of 0 and a zero gradient, never a NaN.
  none = dict(batch, loss_mask=jnp.zeros((4, 32), jnp.uint8))
  l0, g0, loss_S, tokens_S = step_lib.loss_and_grads(run.step, params, none)
  assert float(l0) == 0.0 and float(np.asarray(tokens_S).sum()) == 0.0
  assert all(np.isfinite(np.asarray(g)).all() and not np.asarray(g).any()
             for g in jax.tree.leaves(g0))
  # Held out: both sums from one pass, the all-token ones those of the batch without a mask.
  model = run.step.model
  counted = step_lib.eval_losses_all_tokens(model, params, masked, 16)
  np.testing.assert_allclose(counted[0], step_lib.eval_losses(model, params, masked, 16)[0],
                             rtol=1e-6)
  every_S = step_lib.eval_losses(model, params, batch, 16)
  np.testing.assert_allclose(counted[2], every_S[0], rtol=1e-6)
  np.testing.assert_array_equal(counted[3], every_S[1])
