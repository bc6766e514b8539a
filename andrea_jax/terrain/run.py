"""A saved run as a loss terrain: its config, the parameters of one step, a held-out loss function.

:func:`load_checkpoint` reads any trustworthy checkpoint of a run's workdir (not only the newest):
it rebuilds the run's config from the checkpoint's own metadata (``{"step", "config"}``, written by
the trainer) and restores its parameters (only them) onto one local device.
:func:`heldout_loss_fn` closes the model's mean next-token loss over a fixed batch of the run's
evaluation windows, the ``loss_fn(params)`` every :mod:`andrea_jax.terrain` measurement takes.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import orbax.checkpoint as ocp

from andrea_jax import checkpoint as ckpt_lib
from andrea_jax import data as data_lib
from andrea_jax import runconfig
from andrea_jax import step as step_lib
from andrea_jax.model import ModelConfig, Transformer, init_params

PyTree = Any


@dataclasses.dataclass(frozen=True)
class SavedRun:
  """One checkpoint of a run: its config (as trained), the validated run, the step, the weights."""
  config: ml_collections.ConfigDict
  run: runconfig.Run
  step: int
  params: PyTree


def _manager(directory: str) -> ocp.CheckpointManager:
  # The items of andrea_jax.checkpoint.Checkpoints; "state" through the PyTree handler (the format
  # StandardCheckpointHandler writes), which can restore a part of the tree. Restoring writes
  # nothing (create=False, no custom root metadata); read_only=True would too, with two warnings.
  return ocp.CheckpointManager(
      directory, options=ocp.CheckpointManagerOptions(create=False,
                                                      enable_async_checkpointing=False),
      item_handlers={"state": ocp.PyTreeCheckpointHandler(), "meta": ocp.JsonCheckpointHandler()})


def saved_steps(workdir: str) -> list[int]:
  """Steps of ``workdir/checkpoints`` that pass :func:`andrea_jax.checkpoint.verify`, ascending."""
  directory = os.path.join(workdir, "checkpoints")
  if not os.path.isdir(directory):
    return []
  steps = sorted(int(n) for n in os.listdir(directory) if n.isdigit())
  return [s for s in steps if ckpt_lib.verify(os.path.join(directory, str(s))) is None]


def load_checkpoint(workdir: str, step: int | None = None) -> SavedRun:
  """The config and parameters of checkpoint ``step`` of the run in ``workdir`` (default: newest).

  The config is the one stored with the checkpoint, so the model and data are rebuilt as trained.
  Raises ``FileNotFoundError`` naming the steps available when ``step`` has no trustworthy
  checkpoint.

  Example:
    >>> saved = load_checkpoint("runs/tiny", 500)
    >>> saved.step, saved.run.model_config.d_model
    (500, 128)
  """
  steps = saved_steps(workdir)
  directory = os.path.join(os.path.abspath(workdir), "checkpoints")
  if not steps:
    raise FileNotFoundError(f"no usable checkpoint under {directory}")
  if step is None:
    step = steps[-1]
  if step not in steps:
    problem = ckpt_lib.verify(os.path.join(directory, str(step))) if os.path.isdir(
        os.path.join(directory, str(step))) else "not saved"
    raise FileNotFoundError(f"no usable checkpoint for step {step} under {directory} ({problem}); "
                            f"saved steps: {steps}")
  mngr = _manager(directory)
  try:
    meta = mngr.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore())).meta
    config = ml_collections.ConfigDict(meta["config"])
    run = runconfig.build(config)
    # Only the parameters: the rest of the state (optimizer, curriculum, detector) is not needed,
    # and its layout may differ between versions of the trainer.
    device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
    abstract = {"params": jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=device),
        jax.eval_shape(init_params, run.model_config, jax.random.PRNGKey(0)))}
    params = mngr.restore(step, args=ocp.args.Composite(state=ocp.args.PyTreeRestore(
        item=abstract, restore_args=ocp.checkpoint_utils.construct_restore_args(abstract),
        partial_restore=True))).state["params"]
  finally:
    mngr.close()
  return SavedRun(config=config, run=run, step=int(meta.get("step", step)), params=params)


def heldout_batch(config: ml_collections.ConfigDict, run: runconfig.Run, *,
                  sequences_per_source: int | None = None,
                  sources: Sequence[str] | None = None) -> dict[str, np.ndarray]:
  """The run's evaluation windows, all sources concatenated: ``[n * len(sources), T]`` arrays.

  The same fixed windows as the trainer's evaluation (:func:`andrea_jax.data.eval_batches`):
  ``sequences_per_source`` (default ``config.eval.sequences_per_source``) per source of ``sources``
  (default the run's sources in use), with ``source_ids``.
  """
  sources = tuple(run.used_sources if sources is None else sources)
  unknown = [s for s in sources if s not in run.sources]
  if unknown or not sources:
    raise ValueError(f"sources must be a non-empty subset of {list(run.sources)}, got "
                     f"{list(sources)}")
  n = config.eval.sequences_per_source if sequences_per_source is None else sequences_per_source
  tokenizer = data_lib.load_tokenizer(config.data.tokenizer)
  data = data_lib.open_training_data(config.data, tokenizer, sources=run.sources, required=sources,
                                     progress=False)
  parts = []
  for name in sources:
    b = data_lib.eval_batches(data, name, seq_len=config.data.seq_len, num_sequences=n)
    parts.append(dict(b, source_ids=np.full((b["inputs"].shape[0],), run.sources.index(name),
                                            np.int32)))
  return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}


def heldout_loss_fn(model_config: ModelConfig, batch: dict[str, np.ndarray]
                    ) -> Callable[[PyTree], jax.Array]:
  """``params -> mean next-token loss`` (nats/token, float32) over ``batch``.

  ``L(w) = sum_{b,t} m_bt CE(f_w(x)_bt, y_bt) / sum m_bt`` with ``m`` the mask of real tokens. The
  model runs in float32 with XLA attention: Hessian-vector products differentiate the backward
  pass, which cuDNN's fused attention cannot (it has no forward-mode rule), and curvature needs
  float32.
  """
  model = Transformer(dataclasses.replace(model_config, attention_impl="xla", dtype="float32"))
  batch = {k: jnp.asarray(v) for k, v in batch.items()}

  def loss_fn(params: PyTree) -> jax.Array:
    loss_BxT, mask_BxT = step_lib.token_losses(model, params, batch)
    return loss_BxT.sum() / jnp.maximum(mask_BxT.sum(), 1.0)
  return loss_fn
