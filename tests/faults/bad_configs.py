"""A catalogue of invalid run configs as hypothesis strategies: each draw breaks one rule.

Every breakage starts from the valid ``small_run_config()`` (as a plain dict) and changes one field,
or the few fields one cross-field rule ties together, to a value that rule forbids.
``runconfig.build`` must reject every one with a ``ValueError``/``TypeError`` whose message matches
``expect`` (the name of the field broken). The classes (``kind``) are the rows of bench/faults.py.

The valid ranges below are those of the base config's documentation, fixed here by hand: seq_len
32, max_len 64, d_model 32, 2 heads, batch 16, 30 steps with a 5-step warmup, phases of 7-42 steps
with a decision lag of 2, geometries starting at 0, 9 and 18, polish floor hermes3-general >= 0.7
and ceiling dictionary <= 0.25 with repo-docs and repo-docstrings excluded, cliff window 10.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import re
from typing import Any

import hypothesis.strategies as st

from andrea_jax.curriculum import MIXERS, mixer_config

NON_FINITE = st.sampled_from([math.nan, math.inf, -math.inf])
# Values of the wrong type for an int field (floats, even integral ones, are not ints).
NOT_INT = st.one_of(st.floats(allow_nan=True), st.text(max_size=4), st.none(), st.booleans(),
                    st.lists(st.integers(), min_size=1, max_size=2))
# Values of the wrong type for a number field.
NOT_NUMBER = st.one_of(st.text(max_size=4), st.none(), st.booleans(),
                       st.lists(st.floats(), min_size=1, max_size=2))
NOT_BOOL = st.one_of(st.integers(), st.text(max_size=4), st.none(), st.floats())
NOT_STR = st.one_of(st.integers(), st.none(), st.floats(), st.lists(st.text(), max_size=2))


@dataclasses.dataclass(frozen=True)
class Set:
  """Set ``path`` (dotted) to ``value``; several ``Set`` for a cross-field breakage."""
  path: str
  value: Any

  def apply(self, d: dict) -> None:
    *head, last = self.path.split(".")
    for k in head:
      d = d[k]
    d[last] = copy.deepcopy(self.value)


@dataclasses.dataclass(frozen=True)
class Breakage:
  """One invalid config: the changes, the class of fault, and what the error must name."""
  kind: str
  expect: str            # a regular expression the error message must match
  changes: tuple[Set, ...]

  def apply(self, base: dict) -> dict:
    d = copy.deepcopy(base)
    for change in self.changes:
      change.apply(d)
    return d


def _one(kind: str, path: str, values: st.SearchStrategy, expect: str | None = None):
  leaf = path.rsplit(".", 1)[-1]
  return values.map(lambda v: Breakage(kind, expect or leaf, (Set(path, v),)))


def _int_field(path: str, low: int, high: int | None = None, expect: str | None = None):
  bad = st.integers(max_value=low - 1)
  if high is not None:
    bad = st.one_of(bad, st.integers(min_value=high + 1))
  return st.one_of(_one("out of range / negative size", path, bad, expect),
                   _one("wrong type", path, NOT_INT, expect))


def _float_field(path: str, low: float, high: float, *, low_open: bool = False,
                 high_open: bool = False, expect: str | None = None):
  outside = [st.floats(max_value=low, exclude_max=not low_open, allow_nan=False,
                       allow_infinity=False)]
  if high != math.inf:
    outside.append(st.floats(min_value=high, exclude_min=not high_open, allow_nan=False,
                             allow_infinity=False))
  return st.one_of(_one("out of range / negative size", path, st.one_of(*outside), expect),
                   _one("NaN / infinity", path, NON_FINITE, expect),
                   _one("wrong type", path, NOT_NUMBER, expect))


def _under_mixer(name: str, breakage: st.SearchStrategy) -> st.SearchStrategy:
  """``breakage`` of a field of mixer ``name``: the config switched to that mixer first."""
  section = Set("curriculum.mixer", mixer_config(name).to_dict())
  return breakage.map(lambda b: Breakage(b.kind, b.expect, (section,) + b.changes))


def _enum_field(path: str, allowed: tuple[str, ...]):
  unknown = st.text(max_size=8).filter(lambda s: s not in allowed)
  return st.one_of(_one("unknown name", path, unknown), _one("wrong type", path, NOT_STR))


def _bool_field(path: str):
  return _one("wrong type", path, NOT_BOOL)


SOURCE_KEYS = ("hermes3_general", "hermes3_creative", "hermes3_roleplay", "chat", "smoltalk",
               "oasst", "gutenberg", "dictionary", "repo_docs", "repo_docstrings", "extra_01",
               "extra_02", "extra_03", "extra_04", "extra_05", "extra_06")
GEOMETRIES = ("v2_warmup", "v2_firehose", "v3_polish")
_SOURCE_NAME = st.sampled_from(SOURCE_KEYS).map(lambda k: k.replace("_", "-", 1)
                                                if k.startswith(("repo", "extra")) else k)
_UNKNOWN_SOURCE = st.text(alphabet="abcdefghijklmnopqrstuvwxyz-_", min_size=1, max_size=10).filter(
    lambda s: s not in SOURCE_KEYS and s.replace("-", "_") not in SOURCE_KEYS)


def _source_pattern(key: str) -> str:
  return key.replace("_", "[-_]")


def _geometry_breakages():
  out = []
  for g in GEOMETRIES:
    base = f"curriculum.geometries.{g}"
    for field in ("floors", "ceilings"):
      out.append(st.sampled_from(SOURCE_KEYS).flatmap(lambda k, g=g, field=field, base=base: (
          st.one_of(_one("out of range / negative size", f"{base}.{field}.{k}",
               st.one_of(st.floats(max_value=0, exclude_max=True),
                         st.floats(min_value=1, exclude_min=True, allow_infinity=False)),
               expect=f"{g}.*{_source_pattern(k)}|{_source_pattern(k)}.*{g}"),
          _one("NaN / infinity", f"{base}.{field}.{k}", NON_FINITE, expect=_source_pattern(k)),
          _one("wrong type", f"{base}.{field}.{k}", NOT_NUMBER, expect=_source_pattern(k))))))
      # A vector instead of the per-source mapping (of the wrong length, or any length).
      out.append(_one("wrong length / shape", f"{base}.{field}",
                      st.lists(st.floats(0, 1), max_size=20), expect=f"{g}.*{field}|{field}.*{g}"))
      out.append(_UNKNOWN_SOURCE.map(lambda name, base=base, field=field: Breakage(
          "unknown name", re.escape(name), (Set(f"{base}.{field}.{name}", 0.5),))))
    for field in ("only", "exclude"):
      out.append(st.lists(_UNKNOWN_SOURCE, min_size=1, max_size=3).map(
          lambda names, base=base, field=field: Breakage(
              "unknown name", "|".join(re.escape(n) for n in names),
              (Set(f"{base}.{field}", ",".join(names)),))))
      out.append(_one("wrong type", f"{base}.{field}", st.one_of(st.integers(), st.floats(),
                                                                 st.booleans())))
    out.append(_one("wrong type", f"{base}.start_step", NOT_INT, expect=g))
    out.append(_one("unknown name", f"{base}.ceiling", st.floats(0, 1),   # a typo of a field
                    expect="ceiling"))
  # Start steps: the first geometry must start at 0, none may share a step or last < 7 steps.
  out.append(_one("cross-field", "curriculum.geometries.v2_warmup.start_step",
                  st.integers(min_value=1), expect="v2_warmup"))
  out.append(_one("cross-field", "curriculum.geometries.v2_firehose.start_step",
                  st.one_of(st.integers(max_value=6), st.integers(12, 18)), expect="v2_firehose"))
  # Region rules: floors summing above 1, ceilings below 1, a ceiling under its floor, a floor on an
  # excluded source.
  # Sums within the validator's tolerance (1e-12) of 1 are valid: stay 1e-9 clear of it (0.7 +
  # 0.30000000000000004 is 1 + 4e-17, a valid region).
  out.append(st.floats(0.3 + 1e-9, 1).map(lambda v: Breakage(
      "cross-field", "floors sum.*v3_polish",
      (Set("curriculum.geometries.v3_polish.floors.chat", v),))))
  out.append(st.floats(0, 1 / 16 - 1e-9).map(lambda v: Breakage(
      "cross-field", "ceilings sum.*v2_firehose",
      tuple(Set(f"curriculum.geometries.v2_firehose.ceilings.{k}", v) for k in SOURCE_KEYS))))
  out.append(st.floats(0, 0.7, exclude_max=True).map(lambda v: Breakage(
      "cross-field", "hermes3[-_]general.*v3_polish|v3_polish.*hermes3[-_]general",
      (Set("curriculum.geometries.v3_polish.ceilings.hermes3_general", v),))))
  out.append(st.floats(0, 0.3, exclude_min=True).map(lambda v: Breakage(
      "cross-field", "repo[-_]docs",
      (Set("curriculum.geometries.v3_polish.floors.repo_docs", v),))))
  # A geometry's own mixture (held under any mixer, the base config's "andrea" too): its
  # weights are relative shares >= 0 like the static mixer's, and none may fall on a source the
  # geometry excludes.
  out.append(st.floats(0, 10).filter(lambda v: v not in (0.0, 1.0)).map(lambda v: Breakage(
      "cross-field", r"v3_polish\.mixture weighs 'repo-docs', which geometry 'v3_polish' excludes",
      (Set("curriculum.geometries.v3_polish.mixture", {"repo_docs": v}),))))
  out.append(st.one_of(st.floats(max_value=0, exclude_max=True), NON_FINITE, NOT_NUMBER).map(
      lambda v: Breakage("out of range / negative size" if isinstance(v, float) and v < 0
                         else "NaN / infinity" if isinstance(v, float) else "wrong type",
                         r"v2_firehose\.mixture\.chat",
                         (Set("curriculum.mixer", mixer_config("static").to_dict()),
                          Set("curriculum.geometries.v2_firehose.mixture", {"chat": v})))))
  return out


def breakages() -> st.SearchStrategy[Breakage]:
  """Every kind of invalid config, as one strategy."""
  parts = [
      _int_field("seed", 0, 2**31 - 1),
      # model
      _int_field("model.max_len", 32),   # below seq_len = 32 is invalid too
      _int_field("model.num_layers", 1),
      _int_field("model.d_mlp", 1),
      _int_field("model.vocab_multiple", 1),
      _int_field("model.vocab_size", 0),
      # Below the tokenizer's 257 ids.
      _one("out of range / negative size", "model.vocab_size", st.integers(1, 256)),
      _int_field("model.num_heads", 1),
      _int_field("model.d_model", 1),
      _one("cross-field", "model.num_heads", st.integers(3, 31).filter(lambda h: 32 % h)),
      _one("cross-field", "model.d_model", st.integers(1, 1000).filter(lambda d: d % 2)),
      _float_field("model.init_std", 0, math.inf, low_open=True),
      _float_field("model.layer_norm_eps", 0, math.inf, low_open=True),
      _enum_field("model.dtype", ("float32", "bfloat16")),
      _enum_field("model.attention_impl", ("auto", "xla", "cudnn")),
      _bool_field("model.remat"),
      # data
      _int_field("data.seq_len", 1, 64),
      _int_field("data.global_batch_size", 1),
      _int_field("data.prefetch", 1),
      _int_field("data.shard_tokens", 1),
      _int_field("data.workers", 0),
      _float_field("data.builtin_scale", 0, 1000, low_open=True),
      _float_field("data.eval_fraction", 0, 0.5),
      _enum_field("data.corpus", ("builtin", "files")),
      _bool_field("data.verify"),
      _one("unknown name", "data.tokenizer", st.text(min_size=1, max_size=12).map(
          lambda s: "/nonexistent/" + s).filter(lambda s: s != "bytes"), expect="tokenizer"),
      _one("wrong type", "data.tokenizer", NOT_STR),
      _one("unknown name", "data.prepared_dir", st.text(min_size=1, max_size=12).map(
          lambda s: "/nonexistent/" + s), expect="prepared_dir"),
      _one("out of range / negative size", "data.cache_dir", st.just("")),
      # optim
      _float_field("optim.peak_lr", 0, math.inf, low_open=True),
      _float_field("optim.min_lr_ratio", 0, 1),
      _float_field("optim.b1", 0, 1, high_open=True),
      _float_field("optim.b2", 0, 1, high_open=True),
      _float_field("optim.eps", 0, math.inf, low_open=True),
      _float_field("optim.weight_decay", 0, math.inf),
      _float_field("optim.grad_clip", 0, math.inf),
      _int_field("optim.warmup_steps", 0, 30),   # longer than the 30-step run
      _int_field("optim.decay_steps", 0),
      _int_field("optim.grad_accum_steps", 1),
      _one("cross-field", "optim.grad_accum_steps", st.integers(2, 100).filter(lambda k: 16 % k)),
      _enum_field("optim.schedule", ("cosine", "wsd", "constant")),
      st.integers(min_value=26).map(lambda n: Breakage("cross-field", "decay_steps", (
          Set("optim.schedule", "wsd"), Set("optim.decay_steps", n)))),
      # train
      _int_field("train.num_steps", 5),   # shorter than the 5-step warmup is invalid too
      _int_field("train.log_every", 1),
      _int_field("train.checkpoint_every", 0),
      _int_field("train.keep_checkpoints", 1),
      _int_field("train.max_nonfinite_steps", 1),
      _int_field("train.stop_step", 0, 30),   # past the 30-step run is invalid too
      _bool_field("train.progress_bar"),
      _bool_field("train.plot"),
      # eval
      _int_field("eval.every", 0),
      _int_field("eval.sequences_per_source", 1),
      _int_field("eval.sample_tokens", 0),
      # The longest prompts, "The " and "def " (4 bytes and the end-of-document id), and 60 new
      # tokens are 65 positions: more than max_len 64. Refused before training, not after it.
      _one("cross-field", "eval.sample_tokens", st.integers(60, 10**6)),
      _int_field("eval.top_k", 0, 257),   # more than the 257 byte ids
      # Steps and counts are int32 in the compiled step.
      *[_one("out of range / negative size", path, st.integers(2**31, 2**70))
        for path in ("train.num_steps", "train.log_every", "eval.every",
                     "curriculum.phase_max_steps")],
      _one("out of range / negative size", "curriculum.geometries.v3_polish.start_step",
           st.integers(2**31, 2**70), expect="v3_polish"),
      _float_field("eval.temperature", 0, math.inf, low_open=True),
      _one("wrong type", "eval.prompts", st.one_of(
          st.text(max_size=5), st.integers(), st.none(),
          st.lists(st.one_of(st.just(""), st.integers(), st.none()), min_size=1, max_size=3))),
      # curriculum
      _one("unknown name", "curriculum.mixer.name",
           st.text(max_size=8).filter(lambda s: s not in MIXERS and ":" not in s),
           expect="curriculum.mixer.name"),
      _one("wrong type", "curriculum.mixer.name", NOT_STR, expect="curriculum.mixer.name"),
      _int_field("curriculum.phase_min_steps", 4, 9),
      _int_field("curriculum.phase_max_steps", 13),
      _int_field("curriculum.decision_lag", 0, 5),
      _float_field("curriculum.mixer.random_share", 0, 1),
      _float_field("curriculum.mixer.eta", 0, 1, low_open=True),
      _float_field("curriculum.mixer.discount", 0, 1, low_open=True),
      _float_field("curriculum.mixer.exploration", 0, math.inf),
      _float_field("curriculum.mixer.min_count", 0, math.inf, low_open=True),
      _float_field("curriculum.mixer.prior_count", 0, math.inf, low_open=True),
      _float_field("curriculum.mixer.reward_knee", 0, math.inf, low_open=True),
      _float_field("curriculum.mixer.pivot_discount", 0, 1),
      _one("unknown name", "curriculum.mixer.reward", st.sampled_from(["nope:reward", "x.y:z"]),
           expect="curriculum.mixer.reward"),
      _one("unknown name", "curriculum.mixer.discont", st.floats(0, 1), expect="discont"),
      _under_mixer("elastic", _float_field("curriculum.mixer.uniform_mix", 0, 1)),
      _under_mixer("elastic", _int_field("curriculum.mixer.burn_in", 0)),
      _under_mixer("elastic", _float_field("curriculum.mixer.forget", 0, math.inf)),
      _under_mixer("static", _float_field("curriculum.mixer.mixture.chat", 0, math.inf)),
      _under_mixer("static", _float_field("curriculum.mixer.mixture.extra_06", 0, math.inf)),
      _under_mixer("static", st.just(Breakage(
          "cross-field", "mixture: every weight is 0",
          tuple(Set(f"curriculum.mixer.mixture.{k}", 0.0) for k in SOURCE_KEYS)))),
      _under_mixer("exp3", _float_field("curriculum.mixer.smoothing", 0, 1, high_open=True)),
      _under_mixer("exp3", _float_field("curriculum.mixer.lr_scale", 0, math.inf)),
      # target gain: a reward that is not measured, or a measurement without a target
      st.just(Breakage("cross-field", "set probes.target_gain.every > 0",
                       (Set("curriculum.mixer.reward", "target_gain"),))),
      st.just(Breakage("cross-field", "eval.target is not set",
                       (Set("probes.target_gain.every", 4),))),
      st.just(Breakage("cross-field", "reward = 'grad_cos' is neither a built-in reward",
                       (Set("curriculum.mixer.reward", "grad_cos"),))),
      _int_field("probes.target_gain.every", 0),
      _int_field("probes.target_gain.rows_per_source", 1),
      _int_field("probes.target_gain.target_rows", 1),
      _bool_field("probes.target_gain.precondition"),
      _one("unknown name", "probes.target_gain.target_split", st.sampled_from(["test", "", "Train"]),
           expect="probes.target_gain.target_split"),
      _one("unknown name", "eval.untrained", st.sampled_from(["nope", "chat,nope"]),
           expect="eval.untrained"),
      # cliff
      _int_field("cliff.window", 10),   # below min_source_history = 10 is invalid too
      _int_field("cliff.warmup", 0),
      _int_field("cliff.cooldown", 0),
      _int_field("cliff.min_source_history", 1, 10),
      _float_field("cliff.threshold", 0, math.inf, low_open=True),
      _float_field("cliff.min_relative_drop", 0, 1, high_open=True),
      _bool_field("cliff.respond"),
      _bool_field("cliff.require_source"),
      _enum_field("cliff.baseline", ("mixture", "total")),
      _one("unknown name", "cliff.treshold", st.floats(0, 10), expect="treshold"),
  ]
  return st.one_of(*parts, *_geometry_breakages())
