"""Generation with the KV cache against the uncached forward pass, and what sampling guarantees."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from andrea_jax import generate as gen
from andrea_jax import model as m

CFG = m.tiny(max_len=24, num_layers=2, d_model=32, num_heads=4, d_mlp=64)


def _random_params(std=0.3, seed=0):
  """GPT-2-shaped parameters: matrices normal(0, std), larger than the training init so a random
  model's predictions vary from step to step; LayerNorm scales 1, biases 0. (Cheaper here than
  compiling the initialiser.)"""
  rng = np.random.default_rng(seed)

  def leaf(path, s):
    name = path[-1].key
    if name in ("scale", "bias"):
      return jnp.full(s.shape, 1.0 if name == "scale" else 0.0, jnp.float32)
    return jnp.asarray(std * rng.normal(size=s.shape), jnp.float32)

  shapes = jax.eval_shape(m.init_params, CFG, jax.random.key(0))
  return jax.tree_util.tree_map_with_path(leaf, shapes)


PARAMS = _random_params()
PROMPT = jax.random.randint(jax.random.key(1), (3, 5), 0, CFG.vocab_size)
N = 8  # new tokens in most tests: one compiled program per sampling mode

_generate = jax.jit(gen.generate, static_argnames=("max_new_tokens", "top_k", "greedy"))


@jax.jit
def _full_logits(tokens):
  return m.Transformer(CFG).apply({"params": PARAMS}, tokens)


def test_decode_logits_equal_full_forward():
  tokens = jax.random.randint(jax.random.key(2), (3, 13), 0, CFG.vocab_size)

  @jax.jit
  def step(cache, chunk):
    out, state = m.Transformer(CFG).apply({"params": PARAMS, "cache": cache}, chunk, decode=True,
                                          mutable=["cache"])
    return state["cache"], out

  # Prefill 7 tokens at once, then one token at a time.
  cache, first = step(gen.init_cache(CFG, 3), tokens[:, :7])
  logits = [first]
  for i in range(7, 13):
    cache, out = step(cache, tokens[:, i:i + 1])
    logits.append(out)
  np.testing.assert_allclose(jnp.concatenate(logits, 1), _full_logits(tokens), atol=1e-5)
  assert int(cache["index"]) == 13


def test_greedy_rows_beside_drawn_rows_equal_the_calls_of_each_kind_alone():
  """One program for both kinds: the greedy rows are the greedy call's, the drawn rows are what a
  call with only them draws with the same key (the draws of a row do not depend on the others)."""
  key = jax.random.key(4)
  both = _generate(PARAMS, CFG, PROMPT, key, max_new_tokens=N, greedy=(False, True, False))
  alone_greedy = _generate(PARAMS, CFG, PROMPT[1:2], key, max_new_tokens=N, greedy=True)
  alone_drawn = _generate(PARAMS, CFG, PROMPT[::2], key, max_new_tokens=N)
  np.testing.assert_array_equal(both[1:2], alone_greedy)
  np.testing.assert_array_equal(both[::2], alone_drawn)
  with pytest.raises(ValueError, match=r"greedy must be one bool or one per prompt row \(3\); "
                                       r"got \(True, False\)"):
    gen.generate(PARAMS, CFG, PROMPT, key, max_new_tokens=N, greedy=(True, False))


def test_greedy_with_cache_equals_stepwise_argmax_without_cache():
  out = _generate(PARAMS, CFG, PROMPT, jax.random.key(3), max_new_tokens=N, greedy=True)
  assert out.shape == (3, 5 + N) and out.dtype == jnp.int32
  np.testing.assert_array_equal(out[:, :5], PROMPT)
  # Uncached reference: the full forward over a fixed-length buffer (causal, so the zeros after
  # position t do not affect its logits), one argmax per step.
  ref = np.zeros((3, 5 + N), np.int32)
  ref[:, :5] = PROMPT
  for t in range(5, 5 + N):
    ref[:, t] = np.argmax(np.asarray(_full_logits(jnp.asarray(ref)))[:, t - 1], axis=-1)
  np.testing.assert_array_equal(out, ref)
  assert len(np.unique(ref[:, 5:])) > 3  # the check is not about a constant sequence


def test_top_k_one_is_greedy():
  # On the model's own next-token logits, for many keys and temperatures (generate draws every
  # token through sample_logits, so this is its top_k=1 path).
  logits_BxV = _full_logits(PROMPT)[:, -1]
  greedy = gen.sample_logits(logits_BxV, jax.random.key(0), greedy=True)
  np.testing.assert_array_equal(greedy, np.argmax(np.asarray(logits_BxV), axis=-1))
  for i, temperature in enumerate([0.1, 1.0, 10.0]):
    draws = jax.vmap(lambda k: gen.sample_logits(logits_BxV, k, temperature=temperature, top_k=1))(
        jax.random.split(jax.random.key(i), 50))
    np.testing.assert_array_equal(draws, np.broadcast_to(greedy, draws.shape))


def test_samples_only_from_top_k_and_depend_on_key():
  k = 3
  out = np.asarray(_generate(PARAMS, CFG, PROMPT, jax.random.key(6), max_new_tokens=N, top_k=k,
                             temperature=2.0))
  logits = np.asarray(_full_logits(jnp.asarray(out)))  # position i predicts token i + 1
  for i in range(5, out.shape[1]):
    top = np.argsort(-logits[:, i - 1], axis=-1)[:, :k]
    assert all(out[b, i] in top[b] for b in range(out.shape[0])), i
  np.testing.assert_array_equal(
      out, _generate(PARAMS, CFG, PROMPT, jax.random.key(6), max_new_tokens=N, top_k=k,
                     temperature=2.0))
  assert not np.array_equal(
      out, _generate(PARAMS, CFG, PROMPT, jax.random.key(7), max_new_tokens=N, top_k=k,
                     temperature=2.0))


@pytest.mark.parametrize("temperature, top_k", [(2.0, 4), (0.5, None)])
def test_sampling_frequencies_follow_tempered_softmax(temperature, top_k):
  # n draws from the model's next-token logits; frequencies must match softmax(logits / T)
  # (restricted to the top k), within 5 standard errors.
  n = 4000
  logits_V = _full_logits(PROMPT)[0, -1]
  draw = lambda key: gen.sample_logits(logits_V[None], key, temperature=temperature, top_k=top_k)
  draws = np.asarray(jax.jit(jax.vmap(draw))(jax.random.split(jax.random.key(8), n)))[:, 0]
  logits = np.asarray(logits_V, np.float64) / temperature
  if top_k is not None:
    logits[np.argsort(-logits)[top_k:]] = -np.inf
  p = np.exp(logits - logits.max())
  p /= p.sum()
  freq = np.bincount(draws, minlength=CFG.vocab_size) / n
  assert np.all(freq[p == 0] == 0)
  assert np.sum(p > 0.02) >= 3  # a spread-out distribution, not one dominant token
  tol = 5 * np.sqrt(p * (1 - p) / n) + 1e-3
  np.testing.assert_array_less(np.abs(freq - p), tol)


def test_sample_logits_by_hand():
  logits = jnp.array([[0.0, 5.0, 1.0], [3.0, -1.0, 2.0]])
  key = jax.random.key(0)
  np.testing.assert_array_equal(gen.sample_logits(logits, key, greedy=True), [1, 0])
  np.testing.assert_array_equal(gen.sample_logits(logits, key, top_k=1), [1, 0])
  draws = jax.vmap(lambda k: gen.sample_logits(logits, k, top_k=2))(jax.random.split(key, 200))
  assert set(np.unique(draws[:, 0])) == {1, 2} and set(np.unique(draws[:, 1])) == {0, 2}


def test_argument_validation():
  run = functools.partial(gen.generate, PARAMS, CFG, PROMPT, jax.random.key(0))
  with pytest.raises(ValueError, match="max_len=24"):
    run(max_new_tokens=20)
  with pytest.raises(ValueError, match="top_k.*0"):
    run(max_new_tokens=2, top_k=0)
  with pytest.raises(ValueError, match="temperature.*0"):
    run(max_new_tokens=2, temperature=0.0)
  with pytest.raises(ValueError, match="generate: max_new_tokens must be >= 0, got -1"):
    run(max_new_tokens=-1)
  with pytest.raises(TypeError, match="generate: max_new_tokens must be an integer, got 2.0"):
    run(max_new_tokens=2.0)
  np.testing.assert_array_equal(run(max_new_tokens=0), PROMPT)


@pytest.mark.slow
def test_bad_input_is_named_eagerly_and_never_a_plausible_token_under_jit():
  run = functools.partial(gen.generate, PARAMS, CFG, PROMPT, jax.random.key(0))
  for bad in (np.float32(0.0), -1.0, float("nan"), float("inf")):
    with pytest.raises(ValueError, match="temperature must be a finite number > 0"):
      run(max_new_tokens=2, temperature=bad)
  with pytest.raises(ValueError, match="temperature must be a finite number > 0"):
    gen.sample_logits(jnp.array([[0.0, 5.0, 1.0]]), jax.random.key(0), temperature=-1.0)
  # Traced, the temperature cannot raise: every new id is -1, which no vocabulary holds.
  jitted = jax.jit(gen.generate, static_argnames=("max_new_tokens", "top_k", "greedy"))
  out = np.asarray(jitted(PARAMS, CFG, PROMPT, jax.random.key(0), max_new_tokens=3,
                          temperature=0.0))
  np.testing.assert_array_equal(out[:, :PROMPT.shape[1]], PROMPT)
  assert (out[:, PROMPT.shape[1]:] == -1).all()
  ok = np.asarray(jitted(PARAMS, CFG, PROMPT, jax.random.key(0), max_new_tokens=3,
                         temperature=1.0))
  np.testing.assert_array_equal(ok, run(max_new_tokens=3))   # a valid traced one is unchanged
  # Prompts: one row, ids outside the vocabulary, a numpy max_new_tokens.
  with pytest.raises(ValueError, match=r"prompt must be \[batch, length\]"):
    gen.generate(PARAMS, CFG, PROMPT[0], jax.random.key(0), max_new_tokens=2)
  bad_prompt = np.array(PROMPT).copy()
  bad_prompt[0, 1] = CFG.vocab_size
  with pytest.raises(ValueError, match=rf"prompt\[0, 1\] = {CFG.vocab_size} is not a token id"):
    gen.generate(PARAMS, CFG, bad_prompt, jax.random.key(0), max_new_tokens=2)
  assert run(max_new_tokens=np.int64(2)).shape == (PROMPT.shape[0], PROMPT.shape[1] + 2)


def test_a_sequence_longer_than_max_len_is_refused():
  tokens = jnp.zeros((1, CFG.max_len + 1), jnp.int32)
  with pytest.raises(ValueError, match=f"sequence length {CFG.max_len + 1} exceeds config.max_len"):
    m.Transformer(CFG).apply({"params": PARAMS}, tokens)


def test_vocab_limit_keeps_every_new_id_below_it():
  # A model with more rows than its tokenizer (ANDREA-120M's 50,257 with the byte tokenizer's 257):
  # only ids the tokenizer can decode may come out, greedy or sampled.
  limit = 7
  for kwargs in ({"greedy": True}, {"temperature": 5.0}, {"top_k": limit}):
    out = np.asarray(gen.generate(PARAMS, CFG, PROMPT, jax.random.key(3), max_new_tokens=12,
                                  vocab_limit=limit, **kwargs))
    assert (out[:, PROMPT.shape[1]:] < limit).all() and (out[:, PROMPT.shape[1]:] >= 0).all()
  unlimited = np.asarray(gen.generate(PARAMS, CFG, PROMPT, jax.random.key(3), max_new_tokens=12,
                                      temperature=5.0))
  assert (unlimited[:, PROMPT.shape[1]:] >= limit).any()   # the limit is what kept them below
  with pytest.raises(ValueError, match=r"generate: top_k must be <= 7, got 8 \(the vocab_limit\)"):
    gen.generate(PARAMS, CFG, PROMPT, jax.random.key(0), max_new_tokens=2, vocab_limit=7, top_k=8)
  with pytest.raises(ValueError, match=rf"generate: vocab_limit must be <= {CFG.vocab_size}, got "
                     rf"{CFG.vocab_size + 1} \(the model's vocab_size\)"):
    gen.generate(PARAMS, CFG, PROMPT, jax.random.key(0), max_new_tokens=2,
                 vocab_limit=CFG.vocab_size + 1)
