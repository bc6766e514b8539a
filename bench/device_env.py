"""What a machine offers this project, as one JSON line: ``python -m bench.device_env``.

Python and package versions (jax, jaxlib, flax, optax, orbax, numpy, torch, ml-collections,
tensorboardX), jax's backend and devices, the cuDNN version jax's CUDA plugin reports, and whether
torch sees a GPU. Every question is answered on its own: one that fails records why and the others
still run. bench/device_check.py reads the line that starts with ``ENV``.
"""

import importlib.metadata
import json
import platform
import sys

PACKAGES = ("jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "numpy", "torch",
            "ml-collections", "tensorboardX")


def describe() -> dict:
  """The versions, devices and cuDNN of this interpreter's environment (see the module doc)."""
  out = {"python": platform.python_version(), "executable": sys.executable}
  for name in PACKAGES:
    try:
      out[name] = importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
      out[name] = None
  try:
    import jax
    out["backend"] = jax.default_backend()
    out["devices"] = [d.device_kind for d in jax.devices()]
  except Exception as e:  # pylint: disable=broad-except -- recorded; the other answers still come
    out["jax_error"] = f"{type(e).__name__}: {e}"[:300]
  try:
    from jax._src.lib import cuda_versions   # None without jax's CUDA plugin
    out["cudnn"] = cuda_versions.cudnn_get_version() if cuda_versions else None
  except Exception as e:  # pylint: disable=broad-except
    out["cudnn"] = f"unknown ({type(e).__name__})"
  try:
    import torch
    out["torch_cuda"] = torch.cuda.is_available()
    out["torch_device"] = torch.cuda.get_device_name() if out["torch_cuda"] else None
  except Exception as e:  # pylint: disable=broad-except
    out["torch_error"] = f"{type(e).__name__}: {e}"[:300]
  return out


if __name__ == "__main__":
  print("ENV " + json.dumps(describe()))
