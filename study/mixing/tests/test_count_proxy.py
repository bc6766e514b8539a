"""study/mixing/count_proxy.py's count model, against probabilities worked out by hand and the rules every
distribution must follow. (The screen on the built-in corpus is the benchmark's job.)"""

import itertools

import numpy as np
import pytest

from study.mixing import count_proxy as bench


def test_gram_keys_are_base_expansions():
  x = np.array([3, 1, 4, 1, 5])
  np.testing.assert_array_equal(bench.gram_keys(x, 2, 7), [3 * 7 + 1, 1 * 7 + 4, 4 * 7 + 1,
                                                           1 * 7 + 5])
  np.testing.assert_array_equal(bench.gram_keys(x, 3, 10), [314, 141, 415])
  assert bench.gram_keys(x, 6, 10).size == 0


def test_bigram_probabilities_by_hand():
  # "0 1 0 1 0 1": unigram counts 3 and 3, so p1 = (3 + 1/2) / (6 + 2/2) = 1/2 each. After 0: the
  # bigram 01 three times, one distinct follower: p(1|0) = (3 - 0.75 + 0.75 * 1 * 1/2) / 3 =
  # 0.875, p(0|0) = 0.375 / 3 = 0.125. After 1: 10 twice: p(0|1) = (2 - 0.75 + 0.375) / 2.
  m = bench.CountModel([np.array([0, 1, 0, 1, 0, 1])], order=2, vocab=2)
  np.testing.assert_allclose(m.token_probs(np.array([0, 1, 0, 0, 1, 0])),
                             [0.875, 0.8125, 0.125, 0.875, 0.8125])
  np.testing.assert_allclose(m.log_loss(np.array([0, 1])), -np.log(0.875))


def test_trigram_probabilities_by_hand():
  # "0 1 0 1 0 1" at order 3: after "0 1" the trigram 010 twice, one follower, backing off to the
  # bigram model above: p(0|01) = (2 - 0.75 + 0.75 p2(0|1)) / 2 with p2(0|1) = 0.8125, p(1|01) =
  # 0.75 p2(1|1) / 2 with p2(1|1) = 0.75 * 1/2 / 2; after "1 0": p(1|10) = (1.25 + 0.75 *
  # 0.875) / 2.
  m = bench.CountModel([np.array([0, 1, 0, 1, 0, 1])], order=3, vocab=2)
  np.testing.assert_allclose(m.token_probs(np.array([0, 1, 0])), [0.9296875])
  np.testing.assert_allclose(m.token_probs(np.array([0, 1, 1])), [0.0703125])
  np.testing.assert_allclose(m.token_probs(np.array([1, 0, 1])), [0.953125])


def test_a_context_seen_only_at_a_segments_end_backs_off():
  # In "0 1 2" the token 2 is never followed by anything: p(x|2) is the unigram's, 1.5 / 4.5.
  m = bench.CountModel([np.array([0, 1, 2])], order=2, vocab=3)
  np.testing.assert_allclose(m.token_probs(np.array([2, 0])), [1 / 3])
  np.testing.assert_allclose(m.token_probs(np.array([2, 2])), [1 / 3])


def test_unseen_context_backs_off_and_segments_do_not_join():
  # Two segments "0 0" and "1 1": the bigram 01 is never counted, and the context 2 is never seen.
  m = bench.CountModel([np.array([0, 0]), np.array([1, 1])], order=2, vocab=3)
  p1 = np.array([2.5, 2.5, 0.5]) / 5.5                        # (counts + 1/2) / (4 + 3/2)
  # After 0: c(0) = 1 (the bigram 00 once), one follower: p(1|0) = 0.75 * p1(1).
  np.testing.assert_allclose(m.token_probs(np.array([0, 1])), [0.75 * p1[1]])
  np.testing.assert_allclose(m.token_probs(np.array([2, 1])), [p1[1]])


@pytest.mark.parametrize("order", [1, 2, 3])
def test_every_context_gives_a_distribution(order):
  rng = np.random.default_rng(order)
  vocab = 4
  m = bench.CountModel([rng.integers(0, vocab, 50), rng.integers(0, 2, 30)], order, vocab)
  for context in itertools.product(range(vocab), repeat=order - 1):
    probs = [m.token_probs(np.array([*context, x]))[0] for x in range(vocab)]
    assert min(probs) > 0
    np.testing.assert_allclose(sum(probs), 1.0, rtol=1e-12)


def test_probe_losses_take_each_sources_share_of_the_tokens():
  # Source 0 alternates 0/1, source 1 repeats 2; with 10 tokens at shares (0.8, 0.2) the model is
  # the one counted on the first 8 and first 2 tokens.
  train = [np.array([0, 1] * 10), np.array([2] * 10)]
  held = [np.array([0, 1, 0, 1]), np.array([2, 2, 2])]
  got = bench.probe_losses(train, held, [0.8, 0.2], 10, order=2, vocab=3)
  m = bench.CountModel([train[0][:8], train[1][:2]], 2, 3)
  np.testing.assert_allclose(got, [m.log_loss(held[0]), m.log_loss(held[1])])


def test_bad_settings_are_refused():
  with pytest.raises(ValueError, match="order must be >= 1 .* order 8 for a vocabulary of 257"):
    bench.CountModel([np.array([1, 2, 3])], order=8, vocab=257)
  with pytest.raises(ValueError, match="order 0"):
    bench.CountModel([np.array([1, 2, 3])], order=0, vocab=257)
  with pytest.raises(ValueError, match="discount must be in \\(0, 1\\] .* discount 1.5"):
    bench.CountModel([np.array([1, 2, 3])], order=2, vocab=257, discount=1.5)
  with pytest.raises(ValueError, match="add 0"):
    bench.CountModel([np.array([1, 2, 3])], order=2, vocab=257, add=0)


def test_a_base_under_the_unigram_level_by_hand():
  # "0 1 0 1 0 1" over 3 tokens: c = (3, 3, 0), N = 6, two distinct tokens seen. With base b the
  # unigram level is (max(c - 0.75, 0) + 0.75 * 2 * b) / 6: (2.25 + 1.5 * 0.5) / 6 = 0.5 for a 0
  # with b = 0.5, and 1.5 * 0.2 / 6 = 0.05 for the unseen 2 with b = 0.2.
  m = bench.CountModel([np.array([0, 1, 0, 1, 0, 1])], order=1, vocab=3)
  np.testing.assert_allclose(m.token_probs(np.array([0, 2]), base=np.array([0.5, 0.2])),
                             [0.5, 0.05])
  with pytest.raises(ValueError, match=r"base must hold one probability per scored token, shape "
                                       r"\(2,\), got \(3,\)"):
    m.token_probs(np.array([0, 2]), base=np.ones(3) / 3)


@pytest.mark.parametrize("order", [1, 2, 3])
def test_a_model_backed_off_to_another_gives_a_distribution(order):
  rng = np.random.default_rng(10 + order)
  vocab = 4
  pooled = bench.CountModel([rng.integers(0, vocab, 60), rng.integers(0, 2, 30)], order, vocab)
  own = bench.CountModel([rng.integers(1, 3, 20)], order, vocab)
  for context in itertools.product(range(vocab), repeat=order - 1):
    grams = [np.array([*context, x]) for x in range(vocab)]
    probs = [own.token_probs(g, base=pooled.token_probs(g))[0] for g in grams]
    assert min(probs) > 0
    np.testing.assert_allclose(sum(probs), 1.0, rtol=1e-12)
    # The base is used: the token the own model never saw (0, 3) takes its probability from it.
    assert not np.allclose(probs, [own.token_probs(g)[0] for g in grams])


def test_a_model_that_counted_nothing_gives_its_base():
  m = bench.CountModel([np.array([], np.int64)], order=2, vocab=3)
  np.testing.assert_allclose(m.token_probs(np.array([0, 2, 1]), base=np.array([0.3, 0.6])),
                             [0.3, 0.6])


def test_source_aware_losses_by_hand():
  # Order 1, 8 tokens at shares (1/2, 1/2): source 0 counts "0 0 0 1", source 1 "2 2" (all it
  # has). Pooled unigram: (3 + 1/2, 1 + 1/2, 2 + 1/2) / 7.5. Source 0 (N 4, two tokens seen) on
  # "0 1": (2.25 + 1.5 * 3.5 / 7.5) / 4 = 0.7375 and (0.25 + 1.5 * 1.5 / 7.5) / 4 = 0.1375.
  # Source 1 (N 2, one token seen) on "2 0": (1.25 + 0.75 * 2.5 / 7.5) / 2 = 0.75 and
  # 0.75 * 3.5 / 7.5 / 2 = 0.175.
  got = bench.source_aware_losses([np.array([0, 0, 0, 1, 1]), np.array([2, 2])],
                                  [np.array([0, 1]), np.array([2, 0])], [0.5, 0.5], 8, order=1,
                                  vocab=3)
  np.testing.assert_allclose(got, [-np.log(0.7375 * 0.1375) / 2, -np.log(0.75 * 0.175) / 2])


def test_source_aware_losses_at_order_2_by_hand():
  # 8 tokens at shares (1/2, 1/2): source 0 counts "0 1 0 1", source 1 "1 1". Pooled: unigram
  # (2 + 1/2, 4 + 1/2) / 7, bigrams 01 twice, 10 once, 11 once (none across the two sources).
  # Pooled p(1|0) = (1.25 + 0.75 * 4.5/7) / 2, p(1|1) = (0.25 + 1.5 * 4.5/7) / 2, p(0|1) = (0.25 +
  # 1.5 * 2.5/7) / 2: each the base of the own model's unigram level, for the same token in the
  # same context.
  pooled_1_0 = (1.25 + 0.75 * 4.5 / 7) / 2
  pooled_1_1 = (0.25 + 1.5 * 4.5 / 7) / 2
  pooled_0_1 = (0.25 + 1.5 * 2.5 / 7) / 2
  # Source 0 (unigram 2 and 2, N 4, two seen; after 0: 01 twice; after 1: 10 once) on "0 1 1":
  # p(1|0) = (1.25 + 0.75 u) / 2 with u = (1.25 + 1.5 pooled(1|0)) / 4, and p(1|1) = 0.75 u' / 1
  # with u' = (1.25 + 1.5 pooled(1|1)) / 4 (11 unseen, context 1 seen once with one follower).
  p_1_0 = (1.25 + 0.75 * (1.25 + 1.5 * pooled_1_0) / 4) / 2
  p_1_1 = 0.75 * (1.25 + 1.5 * pooled_1_1) / 4
  # Source 1 (unigram 0 and 2, N 2, one seen; after 1: 11 once) on "1 0": p(0|1) = 0.75 u'' with
  # u'' = 0.75 pooled(0|1) / 2.
  p_0_1 = 0.75 * 0.75 * pooled_0_1 / 2
  got = bench.source_aware_losses([np.array([0, 1, 0, 1, 1]), np.array([1, 1])],
                                  [np.array([0, 1, 1]), np.array([1, 0])], [0.5, 0.5], 8,
                                  order=2, vocab=2)
  np.testing.assert_allclose(got, [-np.log(p_1_0 * p_1_1) / 2, -np.log(p_0_1)])
