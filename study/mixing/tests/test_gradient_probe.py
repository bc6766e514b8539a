"""The influence estimator (study.mixing.influence) and study/mixing/gradient_probe.py's other
pieces, against numbers worked by hand, dense matrices and optax's own AdamW. (The screens on the
built-in corpus are the benchmark's job.)"""


import jax
import jax.flatten_util
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from study.mixing import influence as inf

from study.mixing import gradient_probe as bench


def test_halves_alternate_each_sources_rows():
  a, b = inf.halves(np.array([0, 1, 0, 0, 1, 2]), 4)
  # source 0: rows 0, 2, 3 -> A = {0, 3}, B = {2}; source 1: A = {1}, B = {4};
  # source 2 has one row and source 3 none: no halves.
  np.testing.assert_allclose(a[0], [0.5, 0, 0, 0.5, 0, 0])
  np.testing.assert_allclose(b[0], [0, 0, 1, 0, 0, 0])
  np.testing.assert_allclose(a[1], [0, 1, 0, 0, 0, 0])
  np.testing.assert_allclose(b[1], [0, 0, 0, 0, 1, 0])
  assert not a[2:].any() and not b[2:].any()


def test_source_weights_average_by_tokens():
  w = bench.source_weights(np.array([1, 0, 1]), np.array([10.0, 4.0, 30.0]), 3)
  np.testing.assert_allclose(w, [[0, 1, 0], [0.25, 0, 0.75], [0, 0, 0]])


def test_cross_products_by_hand():
  # two leaves, rows 0..2; M[j, s] = sum over parameters of gA_j * p * gB_s
  grads = {"w": np.array([[1.0, 2.0], [3.0, -1.0], [0.0, 1.0]]), "b": np.array([[2.0], [1.0],
                                                                               [-1.0]])}
  precond = {"w": np.array([1.0, 0.5]), "b": np.array([2.0])}
  wa = np.array([[1.0, 0, 0], [0, 0, 1.0]])     # A: source 0 = row 0, source 1 = row 2
  wb = np.array([[0, 1.0, 0], [0.5, 0.5, 0]])   # B: source 0 = row 1, source 1 = rows 0, 1
  m = bench.cross_products(grads, precond, wa, wb)
  # gA_0 = (1, 2 | 2), gA_1 = (0, 1 | -1); gB_0 = (3, -1 | 1), gB_1 = (2, 0.5 | 1.5)
  expect = [[1 * 3 + 2 * 0.5 * -1 + 2 * 2 * 1, 1 * 2 + 2 * 0.5 * 0.5 + 2 * 2 * 1.5],
            [0 + 1 * 0.5 * -1 + -1 * 2 * 1, 0 + 1 * 0.5 * 0.5 + -1 * 2 * 1.5]]
  np.testing.assert_allclose(m, expect, rtol=1e-6)


def _adam_states(grads_seq, b1=0.9, b2=0.95, eps=1e-8, lr=1e-2):
  tx = optax.adam(lr, b1=b1, b2=b2, eps=eps)
  params = {"w": jnp.zeros(3)}
  state = tx.init(params)
  out = []
  for g in grads_seq:
    out.append(state)
    upd, state = tx.update({"w": jnp.asarray(g)}, state, params)
    out[-1] = (out[-1], np.asarray(upd["w"]))
  return tx, state, out


def test_adam_preconditioner_is_what_optax_divides_by():
  g = [np.array([1.0, -2.0, 0.5]), np.array([0.5, 1.0, -1.0]), np.array([2.0, 0.0, 1.0])]
  _, state, _ = _adam_states(g)
  p = inf.adam_preconditioner(state, eps=1e-8, b2=0.95)["w"]
  v = np.zeros(3)
  for gi in g:
    v = 0.95 * v + 0.05 * gi ** 2
  np.testing.assert_allclose(p, 1 / (np.sqrt(v / (1 - 0.95 ** 3)) + 1e-8), rtol=1e-5)
  assert inf.adam_preconditioner(optax.adam(1e-2).init({"w": jnp.zeros(3)}), 1e-8, 0.95) is None


def test_split_adam_step_sums_to_optax_update():
  rng = np.random.default_rng(0)
  parts = [rng.normal(size=(4, 3)).astype(np.float32) for _ in range(5)]   # [S=4, params=3]
  _, _, seen = _adam_states([p.sum(0) for p in parts])
  mom, nu = {"w": np.zeros((4, 3), np.float32)}, {"w": np.zeros(3, np.float32)}
  for k, (part, (_, optax_update)) in enumerate(zip(parts, seen), start=1):
    mom, nu, upd = bench.split_adam_step(mom, nu, {"w": part}, 1.0, 1e-2, k, 0.9, 0.95, 1e-8)
    np.testing.assert_allclose(upd["w"].sum(0), optax_update, rtol=2e-5, atol=1e-8)



def test_split_adam_step_with_clipping_sums_to_optax_clip_then_adam():
  rng = np.random.default_rng(8)
  parts = [rng.normal(size=(4, 3)).astype(np.float32) for _ in range(4)]
  tx = optax.chain(optax.clip_by_global_norm(1.0), optax.adam(1e-2, b1=0.9, b2=0.95, eps=1e-8))
  params = {"w": jnp.zeros(3)}
  state = tx.init(params)
  mom, nu = {"w": np.zeros((4, 3), np.float32)}, {"w": np.zeros(3, np.float32)}
  for k, part in enumerate(parts, start=1):
    g = part.sum(0)
    clip = min(1.0, 1.0 / float(np.linalg.norm(g)))
    assert clip < 1                     # the clip is active at every step
    want, state = tx.update({"w": jnp.asarray(g)}, state, params)
    mom, nu, upd = bench.split_adam_step(mom, nu, {"w": part}, clip, 1e-2, k, 0.9, 0.95, 1e-8)
    np.testing.assert_allclose(upd["w"].sum(0), want["w"], rtol=2e-5, atol=1e-8)


@pytest.mark.slow
def test_row_grads_average_to_the_batch_gradient():
  # the real model at a toy size; the batch gradient is token_losses' total over all tokens
  from andrea_jax import step as step_lib
  from andrea_jax.model import ModelConfig, Transformer, init_params
  cfg = ModelConfig(vocab_size=11, d_model=8, num_heads=2, num_layers=1, d_mlp=16, max_len=6)
  model = Transformer(cfg)
  rng = np.random.default_rng(1)
  batch = {"inputs": rng.integers(0, 11, (3, 6)).astype(np.int32),
           "targets": rng.integers(0, 11, (3, 6)).astype(np.int32),
           "segment_ids": np.array([[1] * 6, [1] * 4 + [0] * 2, [1] * 3 + [2] * 3], np.int32),
           "positions": np.array([list(range(6)), list(range(6)), [0, 1, 2, 0, 1, 2]], np.int32),
           "source_ids": np.array([0, 1, 0], np.int32)}
  params = init_params(cfg, jax.random.key(0))
  g_B, tok = inf.make_row_grads(model, True)(params, batch)
  np.testing.assert_allclose(tok, [6, 4, 6])
  tok = np.asarray(tok, np.float64)
  mean = jax.tree.map(lambda g: np.tensordot(tok / tok.sum(), np.asarray(g), axes=1), g_B)

  def total(p):
    loss, mask = step_lib.token_losses(model, p, batch, True)
    return loss.sum() / mask.sum()
  ref = jax.grad(total)(params)
  for a, b in zip(jax.tree.leaves(mean), jax.tree.leaves(ref)):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


def _toy():
  from andrea_jax.model import ModelConfig, Transformer, init_params
  cfg = ModelConfig(vocab_size=7, d_model=4, num_heads=1, num_layers=1, d_mlp=4, max_len=4,
                    vocab_multiple=1)
  model = Transformer(cfg)
  rng = np.random.default_rng(2)
  batch = {"inputs": jnp.asarray(rng.integers(0, 7, (2, 4)), jnp.int32),
           "targets": jnp.asarray(rng.integers(0, 7, (2, 4)), jnp.int32),
           "segment_ids": jnp.asarray([[1, 1, 1, 1], [1, 1, 1, 0]], jnp.int32),
           "positions": jnp.asarray([[0, 1, 2, 3], [0, 1, 2, 3]], jnp.int32)}
  return model, init_params(cfg, jax.random.key(3)), batch


def _dense_gauss_newton(model, params, batch):
  # J^T (diag p - p p^T) J / N, with the Jacobian of the logits worked out whole by jacfwd
  flat, unravel = jax.flatten_util.ravel_pytree(params)
  f = lambda x: model.apply({"params": unravel(x)}, batch["inputs"],
                            segment_ids=batch["segment_ids"], positions=batch["positions"])
  logits = np.asarray(f(flat), np.float64)
  jac = np.asarray(jax.jacfwd(f)(flat), np.float64)           # [B, T, V, n]
  mask = np.asarray(batch["segment_ids"]) > 0
  n = flat.size
  g = np.zeros((n, n))
  for b, t in zip(*np.nonzero(mask)):
    p = np.exp(logits[b, t] - logits[b, t].max())
    p /= p.sum()
    g += jac[b, t].T @ (np.diag(p) - np.outer(p, p)) @ jac[b, t]
  return g / mask.sum(), flat, unravel


@pytest.mark.slow
def test_gauss_newton_product_against_the_dense_matrix():
  model, params, batch = _toy()
  dense, flat, unravel = _dense_gauss_newton(model, params, batch)
  v = np.random.default_rng(4).normal(size=flat.size).astype(np.float32)
  got = jax.flatten_util.ravel_pytree(
      inf.make_gauss_newton(model, True)(params, batch, unravel(jnp.asarray(v))))[0]
  np.testing.assert_allclose(got, dense @ v, rtol=1e-3, atol=1e-6)


@pytest.mark.slow
def test_influence_solve_against_a_dense_solve():
  model, params, batch = _toy()
  dense, flat, unravel = _dense_gauss_newton(model, params, batch)
  rng = np.random.default_rng(5)
  d = rng.uniform(0.5, 2.0, flat.size)
  rhs = rng.normal(size=flat.size)
  lam = 0.3
  expect = np.linalg.solve(dense + lam * np.diag(d), rhs)
  got = inf.influence_solve(inf.make_gauss_newton(model, True), params, batch,
                              unravel(jnp.asarray(d, jnp.float32)), lam,
                              unravel(jnp.asarray(rhs, jnp.float32)), iters=500, tol=1e-6)
  np.testing.assert_allclose(jax.flatten_util.ravel_pytree(got)[0], expect, rtol=2e-3,
                             atol=2e-4 * np.abs(expect).max())


def test_lanczos_spans_what_it_is_given_and_projects_the_matrix():
  rng = np.random.default_rng(6)
  m = rng.normal(size=(12, 12))
  a = m @ m.T
  q, t = bench.lanczos(lambda v: a @ v, rng.normal(size=12), 12)
  np.testing.assert_allclose(q.T @ q, np.eye(len(t)), atol=1e-10)
  np.testing.assert_allclose(t, q.T @ a @ q, atol=1e-8)
  assert len(t) == 12


def test_lowrank_forms_are_exact_on_the_whole_space_and_on_a_low_rank_matrixs_range():
  rng = np.random.default_rng(7)
  m = rng.normal(size=(10, 10))
  a_mat = m @ m.T
  lam = 0.7
  a, b = rng.normal(size=(3, 10)), rng.normal(size=(3, 10))
  expect = np.einsum("sn,sn->s", a, np.linalg.solve(a_mat + lam * np.eye(10), b.T).T)
  q, t = bench.lanczos(lambda v: a_mat @ v, rng.normal(size=10), 10)
  np.testing.assert_allclose(bench.lowrank_forms(q, t, lam, a, b), expect, rtol=1e-8)
  # a matrix of rank 3 known on a basis of its range only is known everywhere (0 off it)
  u = rng.normal(size=(10, 3))
  low = u @ u.T
  basis, _ = np.linalg.qr(u)
  expect_low = np.einsum("sn,sn->s", a, np.linalg.solve(low + lam * np.eye(10), b.T).T)
  np.testing.assert_allclose(bench.lowrank_forms(basis, basis.T @ low @ basis, lam, a, b),
                             expect_low, rtol=1e-8)


@pytest.mark.slow
def test_influence_lowrank_with_full_rank_matches_the_conjugate_gradient_solve():
  model, params, batch = _toy()
  batch = dict(batch, source_ids=jnp.asarray([0, 0], jnp.int32))
  opt = optax.adam(1e-2, b1=0.9, b2=0.95)
  state = opt.init(params)
  g = jax.grad(lambda p: bench.make_source_losses(model, 1, True)(p, batch)[0])(params)
  _, state = opt.update(g, state, params)
  n = jax.flatten_util.ravel_pytree(params)[0].size
  exact, _ = inf.influence(model, True, params, state, batch, 1, 0.3, 1e-8, 0.95, iters=2000,
                             tol=1e-7)
  low = bench.influence_lowrank(model, True, params, state, batch, 1, 0.3, 1e-8, 0.95, rank=n,
                                start="random")
  np.testing.assert_allclose(low, exact, rtol=2e-3)


@pytest.mark.slow
def test_influence_against_a_dense_solve_with_gradients_worked_out_alone():
  # b_s = w_s gA^T (G + lam diag(sqrt(v_hat) + eps))^-1 gB, everything formed densely: G from the
  # logits' Jacobian, gA and gB from jax.grad of each row's own mean loss, v_hat from optax's state
  from andrea_jax import step as step_lib
  model, params, batch = _toy()
  batch = dict(batch, source_ids=jnp.asarray([1, 1], jnp.int32))     # source 1 of 2: w = (0, 1)
  tx = optax.adam(1e-2, b1=0.9, b2=0.95, eps=1e-8)
  state = tx.init(params)
  loss = lambda p: step_lib.token_losses(model, p, batch, True)[0].sum()
  for _ in range(2):
    _, state = tx.update(jax.grad(loss)(params), state, params)
  dense, flat, unravel = _dense_gauss_newton(model, params, batch)

  def row_grad(r):
    one = jax.tree.map(lambda x: x[r:r + 1], batch)
    f = lambda x: (lambda l, m: l.sum() / m.sum())(*step_lib.token_losses(model, unravel(x), one,
                                                                          True))
    return np.asarray(jax.grad(f)(flat), np.float64)
  nu = np.asarray(jax.flatten_util.ravel_pytree(state[0].nu)[0], np.float64)
  d = np.sqrt(nu / (1 - 0.95 ** 2)) + 1e-8
  lam = 0.3
  expect = row_grad(0) @ np.linalg.solve(dense + lam * np.diag(d), row_grad(1))
  first_expect = row_grad(0) @ (row_grad(1) / d) / lam
  b, first = inf.influence(model, True, params, state, jax.tree.map(np.asarray, batch), 2, lam,
                             1e-8, 0.95, iters=3000, tol=1e-8)
  np.testing.assert_allclose(b, [0.0, expect], rtol=3e-3, atol=1e-9)
  np.testing.assert_allclose(first, [0.0, first_expect], rtol=1e-4, atol=1e-9)
