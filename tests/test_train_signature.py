"""``train.train_and_evaluate`` introspects as it is called: ``(config, workdir, *, early_signals=())``."""

import inspect

import pytest

from andrea_jax import train
from tests.util import small_run_config


def test_signature_is_the_one_callers_use():
  sig = inspect.signature(train.train_and_evaluate)
  P = inspect.Parameter
  assert [(p.name, p.kind) for p in sig.parameters.values()] == [
      ("config", P.POSITIONAL_OR_KEYWORD), ("workdir", P.POSITIONAL_OR_KEYWORD),
      ("early_signals", P.KEYWORD_ONLY)]
  assert sig.parameters["early_signals"].default == ()
  sig.bind(small_run_config(), "runs/x", early_signals=(15,))
  # A third positional argument: the signature refuses it, and so does the function itself,
  # before it reads the config.
  with pytest.raises(TypeError):
    sig.bind(small_run_config(), "runs/x", None)
  with pytest.raises(TypeError, match="positional argument"):
    train.train_and_evaluate(small_run_config(), "runs/x", None)


def test_annotations_and_metadata_are_the_wrappers():
  f = train.train_and_evaluate
  assert f.__annotations__ == {"config": "ml_collections.ConfigDict", "workdir": "str",
                               "early_signals": "Sequence[int]", "return": "dict"}
  assert not hasattr(f, "__wrapped__")
  assert f.__name__ == f.__qualname__ == "train_and_evaluate" and f.__module__ == "andrea_jax.train"
  assert f.__doc__.startswith("Train (or resume) the run described by ``config``")
