"""Invalid configs (property-based): every one is rejected by ``runconfig.build``, naming the field,
before anything compiles."""

import re

import jax
import ml_collections
import pytest
from hypothesis import HealthCheck, given, settings

from andrea_jax import runconfig
from tests.util import small_run_config
from tests.faults import bad_configs
from tests.faults.harness import count_compiles

BASE = small_run_config().to_dict()


def test_the_base_config_is_valid():
  """Without this, every rejection below could come from the base config itself."""
  run = runconfig.build(ml_collections.ConfigDict(BASE))
  assert run.model.vocab_size == 257


@settings(max_examples=1000, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(bad_configs.breakages())
def test_every_invalid_config_is_rejected_naming_the_field(breakage):
  config = ml_collections.ConfigDict(breakage.apply(BASE))
  with count_compiles() as compiles:
    with pytest.raises((ValueError, TypeError)) as e:
      runconfig.build(config)
  assert re.search(breakage.expect, str(e.value)), (breakage, str(e.value))
  assert compiles.count == 0, breakage


def test_count_compiles_sees_a_compilation():
  """The compile counter above is not blind: a fresh jitted function counts."""
  with count_compiles() as compiles:
    jax.jit(lambda x: x * 3 + 1)(jax.numpy.arange(7.0)).block_until_ready()
  assert compiles.count >= 1
