"""Ways to damage a checkpoint, forge an untrusted one, or corrupt prepared data (tests and bench).

Each function changes files on disk the way a failing disk, a killed copy, a careless user or a
hostile source would, and returns what the error or warning must name.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp

from andrea_jax import checkpoint as ckpt_lib

DAMAGE = ("flip_byte", "truncate", "remove_file", "remove_commit_marker")
def _e(path) -> str:
  return re.escape(str(path))


_MARKERS = ("commit_success.txt", "state/commit_success.txt", "meta/commit_success.txt")


# --- checkpoints -------------------------------------------------------------------------------


def tiny_state(seed: int, w_shape=(4, 3)) -> dict:
  """A small state pytree: float32 parameters and an int32 counter (values from ``seed``)."""
  rng = np.random.default_rng(seed)
  return {"params": {"w": jnp.asarray(rng.normal(size=w_shape), jnp.float32),
                     "b": jnp.asarray(rng.normal(size=(3,)), jnp.float32)},
          "count": jnp.asarray(seed, jnp.int32)}


def abstract(state) -> dict:
  """``ShapeDtypeStruct`` leaves with shardings: what ``restore_latest`` takes."""
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), state)


def write_checkpoints(directory: Path, steps, keep: int = 5) -> dict[int, dict]:
  """Sealed checkpoints of ``tiny_state(step)`` at ``steps``, through :class:`Checkpoints`."""
  ckpts = ckpt_lib.Checkpoints(str(directory), keep=keep)
  states = {}
  for step in steps:
    states[step] = tiny_state(step)
    ckpts.save(step, states[step], {"step": step})
  ckpts.close()
  return states


def write_plain_checkpoint(directory: Path, step: int, state) -> Path:
  """A checkpoint written by orbax without OCDBT: every array has a plain JSON ``.zarray``."""
  mngr = ocp.CheckpointManager(
      str(directory), options=ocp.CheckpointManagerOptions(create=True),
      item_handlers={"state": ocp.StandardCheckpointHandler(use_ocdbt=False),
                     "meta": ocp.JsonCheckpointHandler()})
  mngr.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                          meta=ocp.args.JsonSave({"step": step})))
  mngr.wait_until_finished()
  mngr.close()
  step_dir = directory / str(step)
  ckpt_lib.seal(str(step_dir))
  return step_dir


def _files(step_dir: Path) -> list[Path]:
  return sorted(p for p in step_dir.rglob("*") if p.is_file() and p.name != ckpt_lib.SEAL)


def damage(step_dir: Path, kind: str, rng: np.random.Generator) -> Path:
  """Damage one file of a checkpoint; returns that file (the warning must name it)."""
  if kind == "remove_commit_marker":
    path = step_dir / _MARKERS[rng.integers(len(_MARKERS))]
    path.unlink()
    return path
  files = [p for p in _files(step_dir) if kind == "remove_file" or p.stat().st_size > 0]
  path = files[rng.integers(len(files))]
  if kind == "flip_byte":
    data = bytearray(path.read_bytes())
    data[rng.integers(len(data))] ^= 1 << int(rng.integers(8))
    path.write_bytes(bytes(data))
  elif kind == "truncate":
    with open(path, "r+b") as f:
      f.truncate(int(rng.integers(path.stat().st_size)))
  elif kind == "remove_file":
    path.unlink()
  else:
    raise ValueError(f"unknown damage {kind!r}")
  return path


def _zarray(step_dir: Path, leaf: str) -> Path:
  return step_dir / "state" / leaf / ".zarray"


def _edit_zarray(step_dir: Path, leaf: str, **fields) -> None:
  path = _zarray(step_dir, leaf)
  meta = json.loads(path.read_text())
  meta.update(fields)
  path.write_text(json.dumps(meta))
  ckpt_lib.seal(str(step_dir))   # a consistent forgery: the seal matches


def _outside(step_dir: Path) -> Path:
  out = step_dir.parent.parent / "outside"
  out.mkdir(exist_ok=True)
  return out


# name -> (forge(step_dir) -> regular expression the refusal must match). Each starts from a sealed
# checkpoint of tiny_state(1) at step 1, written without OCDBT.
def _link_file(step_dir):
  target = _outside(step_dir) / "secret"
  target.write_text("not yours")
  victim = _zarray(step_dir, "params.w").parent / "0.0"
  victim.unlink()
  victim.symlink_to(target)
  return rf"{_e(victim)}.*is a link to {_e(target)}, outside the checkpoint"


def _link_dir(step_dir):
  victim = step_dir / "state" / "params.b"
  copy = _outside(step_dir) / "params.b"
  shutil.copytree(victim, copy)
  shutil.rmtree(victim)
  victim.symlink_to(copy, target_is_directory=True)
  return rf"{_e(victim)} is a link to {_e(copy)}, outside the checkpoint"


def _link_step_dir(step_dir):
  copy = _outside(step_dir) / "1"
  shutil.move(str(step_dir), str(copy))
  step_dir.symlink_to(copy, target_is_directory=True)
  return rf"{_e(step_dir)} is a link to {_e(copy)}, not a checkpoint directory"


def _fifo(step_dir):
  os.mkfifo(step_dir / "state" / "pipe")
  return rf"{_e(step_dir / 'state' / 'pipe')} is not a regular file"


def _seal_escape(step_dir):
  seal = step_dir / ckpt_lib.SEAL
  manifest = json.loads(seal.read_text())
  manifest["files"]["../../outside/secret"] = {"size": 9, "sha256": "0" * 64}
  seal.write_text(json.dumps(manifest))
  return r"lists '\.\./\.\./outside/secret', a path outside the checkpoint"


def _seal_malformed(step_dir):
  (step_dir / ckpt_lib.SEAL).write_text(json.dumps({"version": 1, "files": ["state/_METADATA"]}))
  return r"andrea_checksums\.json is malformed"


def _seal_entry_malformed(step_dir):
  seal = step_dir / ckpt_lib.SEAL
  manifest = json.loads(seal.read_text())
  manifest["files"]["state/_METADATA"] = {"size": -1}
  seal.write_text(json.dumps(manifest))
  return r"malformed entry for 'state/_METADATA'"


def _seal_too_deep(step_dir):
  (step_dir / ckpt_lib.SEAL).write_text("[" * 100_000)   # json.loads recurses once per bracket
  return r"andrea_checksums\.json is not valid JSON \(RecursionError"


def _bad_json(rel):
  def forge(step_dir):
    path = step_dir / rel
    path.write_text('{"tree_metadata": {')
    ckpt_lib.seal(str(step_dir))
    return rf"{_e(path)} is not valid JSON"
  return forge


def _json_list(step_dir):
  path = step_dir / "state" / "_METADATA"
  path.write_text("[1, 2, 3]")
  ckpt_lib.seal(str(step_dir))
  return rf"{_e(path)} holds a JSON list, not an object"


def _huge_json(step_dir):
  path = step_dir / "meta" / "metadata"
  with open(path, "r+b") as f:
    f.truncate(65 << 20)   # sparse: nothing is written, nothing must be read
  (step_dir / ckpt_lib.SEAL).unlink()   # unsealed (hashing it would read it)
  return rf"{_e(path)} holds {65 << 20} bytes of metadata"


def _huge_shape(step_dir):
  _edit_zarray(step_dir, "params.w", shape=[10**6, 10**6], chunks=[10**6, 10**6])
  return r"'params\.w' has shape \(1000000, 1000000\) in the checkpoint but \(4, 3\)"


def _dtype(dtype):
  def forge(step_dir):
    _edit_zarray(step_dir, "params.w", dtype=dtype)
    return rf"{_e(_zarray(step_dir, 'params.w'))}.*[Uu]nsupported .*dtype"
  return forge


def _void(step_dir):
  _edit_zarray(step_dir, "params.w", dtype="|V8")   # read as a trailing axis of 8 bytes
  return r"'params\.w' has shape \(4, 3, 8\) in the checkpoint but \(4, 3\)"


def _dtype_mismatch(step_dir):
  _edit_zarray(step_dir, "params.w", dtype="<i4")
  return r"'params\.w' has dtype int32 in the checkpoint but float32"


def _other_config(step_dir):
  shutil.rmtree(step_dir)
  write_plain_checkpoint(step_dir.parent, 1, tiny_state(1, w_shape=(5, 3)))
  return r"'params\.w' has shape \(5, 3\) in the checkpoint but \(4, 3\)"


def _missing_entry(step_dir):
  shutil.rmtree(step_dir)
  state = tiny_state(1)
  del state["params"]["b"]
  write_plain_checkpoint(step_dir.parent, 1, state)
  return r"no array 'params\.b'"


UNTRUSTED = {
    "file link outside": _link_file,
    "directory link outside": _link_dir,
    "step directory is a link": _link_step_dir,
    "FIFO inside": _fifo,
    "seal names a path outside": _seal_escape,
    "seal malformed": _seal_malformed,
    "seal entry malformed": _seal_entry_malformed,
    "seal nested 100,000 deep": _seal_too_deep,
    "malformed state/_METADATA": _bad_json("state/_METADATA"),
    "malformed meta/metadata": _bad_json("meta/metadata"),
    "malformed _CHECKPOINT_METADATA": _bad_json("_CHECKPOINT_METADATA"),
    "malformed state/_sharding": _bad_json("state/_sharding"),
    "malformed array_metadatas": _bad_json("state/array_metadatas/process_0"),
    "metadata JSON not an object": _json_list,
    "metadata of 65 MiB": _huge_json,
    "shape of 10^12 elements": _huge_shape,
    "dtype object": _dtype("|O"),
    "dtype string": _dtype("<U8"),
    "dtype raw bytes": _void,
    "dtype int32 for float32": _dtype_mismatch,
    "shapes of another config": _other_config,
    "an entry missing": _missing_entry,
}


# --- prepared data -----------------------------------------------------------------------------


def _manifest(path: Path) -> dict:
  return json.loads((path / "manifest.json").read_text())


def _write_manifest(path: Path, manifest: dict) -> None:
  (path / "manifest.json").write_text(json.dumps(manifest, indent=1))


def _shard(path: Path, source: str, split: str = "train") -> tuple[Path, dict]:
  entry = _manifest(path)["sources"][source]["shards"][split][0]
  return path / entry["file"], entry


def _set_shard(path: Path, source: str, tokens_N: np.ndarray, split: str = "train") -> None:
  """Rewrite a source's (only) shard of ``split`` and make the manifest agree with it."""
  file, _ = _shard(path, source, split)
  data = tokens_N.astype("<u2").tobytes()
  file.write_bytes(data)
  m = _manifest(path)
  s = m["sources"][source]
  s["shards"][split][0].update(tokens=int(tokens_N.size), sha256=hashlib.sha256(data).hexdigest())
  s["tokens"][split] = int(tokens_N.size)
  _write_manifest(path, m)


def _data_truncated(path, rng):
  file, entry = _shard(path, "chat")
  with open(file, "r+b") as f:
    f.truncate(file.stat().st_size - 2 * int(rng.integers(1, 100)))
  return rf"shard {_e(file)} of source 'chat' is truncated"


def _data_flipped(path, rng):
  file, _ = _shard(path, "gutenberg")
  data = bytearray(file.read_bytes())
  data[int(rng.integers(len(data)))] ^= 0x40
  file.write_bytes(bytes(data))
  return rf"shard {_e(file)} of source 'gutenberg': SHA-256 .* does not match the manifest"


def _data_out_of_range(path, rng):
  file, entry = _shard(path, "oasst")
  tokens = np.fromfile(file, "<u2")
  pos = int(rng.integers(tokens.size))
  bad = int(rng.integers(257, 65536))
  tokens[pos] = bad
  _set_shard(path, "oasst", tokens)
  return rf"shard {_e(file)} of source 'oasst': token id {bad} at position {pos} is >= the vocab"


def _data_empty_source(path, rng):
  m = _manifest(path)
  m["sources"]["smoltalk"]["shards"]["train"] = []
  m["sources"]["smoltalk"]["tokens"]["train"] = 0
  _write_manifest(path, m)
  return rf"{_e(path / 'manifest.json')}: required source 'smoltalk' has 0 training tokens"


def _data_missing_source(path, rng):
  m = _manifest(path)
  del m["sources"]["hermes3-creative"]
  _write_manifest(path, m)
  return rf"{_e(path / 'manifest.json')}: required source 'hermes3-creative' is missing"


def _data_too_short(path, rng):
  _set_shard(path, "dictionary", np.full(int(rng.integers(1, 33)), 65, np.uint16))
  return (r"source 'dictionary' has \d+ train tokens, fewer than seq_len \+ 1 = 33 "
          r"\(shards \[.*dictionary\.train\.00000\.bin'\]\)")


def _data_eval_too_short(path, rng):
  _set_shard(path, "chat", np.full(int(rng.integers(1, 33)), 65, np.uint16), split="eval")
  return (r"source 'chat' has \d+ eval tokens, fewer than seq_len \+ 1 = 33; raise its "
          r"eval_fraction")


def _data_lies_tokens(path, rng):
  m = _manifest(path)
  entry = m["sources"]["chat"]["shards"]["train"][0]
  entry["tokens"] += int(rng.integers(1, 1000))
  _write_manifest(path, m)
  return rf"shard {_e(path / entry['file'])} of source 'chat' is truncated or padded"


def _data_lies_sha(path, rng):
  m = _manifest(path)
  entry = m["sources"]["extra-03"]["shards"]["train"][0]
  entry["sha256"] = "%064x" % int(rng.integers(2**62))
  _write_manifest(path, m)
  return rf"shard {_e(path / entry['file'])} of source 'extra-03': SHA-256 .* does not match"


def _data_lies_missing_shard(path, rng):
  m = _manifest(path)
  m["sources"]["chat"]["shards"]["train"].append(
      {"file": "chat.train.00001.bin", "tokens": 10, "sha256": "0" * 64})
  _write_manifest(path, m)
  return rf"shard {_e(path / 'chat.train.00001.bin')} of source 'chat' is missing"


def _data_renamed_source(path, rng):
  # A manifest may hold sources the run does not use (they are not opened), but not lack one it
  # samples.
  m = _manifest(path)
  m["sources"]["wikipedia"] = m["sources"].pop("chat")
  _write_manifest(path, m)
  return r"required source 'chat' is missing"


def _data_bad_json(path, rng):
  text = (path / "manifest.json").read_text()
  (path / "manifest.json").write_text(text[: int(rng.integers(1, len(text) // 2))])
  return rf"{_e(path / 'manifest.json')} is not valid JSON"


def _data_signed_dtype(path, rng):
  m = _manifest(path)
  m["dtype"] = "int16"   # would let negative token ids through
  for entry in m["sources"].values():
    entry["dtype"] = "int16"
  _write_manifest(path, m)
  return rf"{_e(path / 'manifest.json')}: dtype 'int16', token shards are 'uint16' or 'uint32'"


def _data_other_tokenizer(path, rng):
  m = _manifest(path)
  m["tokenizer"]["fingerprint"] = "f" * 64
  _write_manifest(path, m)
  return (rf"{_e(path / 'manifest.json')}: the data was prepared with tokenizer 'bytes' "
          r"\(fingerprint ffff")


HOSTILE_DATA = {
    "truncated shard": _data_truncated,
    "flipped byte in a shard": _data_flipped,
    "token id out of range": _data_out_of_range,
    "empty source": _data_empty_source,
    "missing source": _data_missing_source,
    "source shorter than a window": _data_too_short,
    "held-out split shorter than a window": _data_eval_too_short,
    "manifest lies: token count": _data_lies_tokens,
    "manifest lies: SHA-256": _data_lies_sha,
    "manifest lies: a shard that does not exist": _data_lies_missing_shard,
    "manifest: a source renamed": _data_renamed_source,
    "manifest: malformed JSON": _data_bad_json,
    "manifest: another tokenizer": _data_other_tokenizer,
    "manifest: a signed dtype": _data_signed_dtype,
}
