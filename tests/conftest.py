"""Test-wide settings: strict rank promotion (catches silent broadcasting bugs) and a jit switch."""

import jax
import pytest

jax.config.update("jax_numpy_rank_promotion", "raise")


@pytest.fixture(params=["eager", "jit"])
def maybe_jit(request):
  """Runs a test twice: once with the function as is, once under ``jax.jit``."""
  if request.param == "jit":
    return jax.jit
  return lambda f, **kw: f
