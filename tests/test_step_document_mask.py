"""``train.document_mask``: attention inside packed documents, or plain causal over the row."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from andrea_jax import runconfig
from andrea_jax import step as step_lib
from andrea_jax.model import init_params
from tests.util import small_run_config


def _batch(segment_ids_BxT):
  B, T = segment_ids_BxT.shape
  tokens = np.random.default_rng(0).integers(1, 256, size=(B, T + 1)).astype(np.int32)
  return {"inputs": jnp.asarray(tokens[:, :-1]), "targets": jnp.asarray(tokens[:, 1:]),
          "segment_ids": jnp.asarray(segment_ids_BxT, jnp.int32),
          "positions": jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (B, T)),
          "source_ids": jnp.zeros((B,), jnp.int32)}


def test_document_mask_only_matters_where_a_row_holds_several_documents():
  run = runconfig.build(small_run_config())
  model = run.step_config.model
  params = init_params(run.model_config, jax.random.PRNGKey(0))
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
  assert runconfig.build(c).step_config.document_mask is True
  c.train.document_mask = False
  assert runconfig.build(c).step_config.document_mask is False
  c = small_run_config()
  with c.unlocked():     # the config's own type check would refuse 1 already: go around it
    del c.train["document_mask"]
    c.train.document_mask = 1
  with pytest.raises(TypeError, match="train.document_mask must be True or False, got 1"):
    runconfig.build(c)
