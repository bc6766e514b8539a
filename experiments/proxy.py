r"""A run under a mixture fitted on small proxy runs (``python -m andrea_jax.fit_proxy``).

  python -m andrea_jax.fit_proxy --config=experiments/tiny.py --workdir=runs/proxy \
      --config.model.num_layers=2 --config.model.d_model=64 --config.model.d_mlp=256
  python -m andrea_jax.main --config=experiments/proxy.py:runs/proxy --workdir=runs/with_proxy

The argument is the fit's workdir. The run is the config file the probes were made from (as
recorded in ``proxy_fit.json``, without the probes' command-line overrides: the target keeps its
own model), with the static strategy holding the fitted mixture on the full simplex for the first
``hold`` of its steps, then the uniform mixture. Override anything on the command line as usual;
the switch to uniform is ``curriculum.geometries.uniform.start_step`` (set from the config
file's ``train.num_steps``), each fitted weight ``curriculum.geometries.proxy.mixture.<source>``.

Expect: on the built-in corpus, the uniform mixture's final held-out loss reached in 16-19.5% fewer
steps than under the uniform mixture (``bench/RESULTS.md``, "A designed proxy").
"""

import importlib.util
import json
import os

from andrea_jax.curriculum import proxy
from andrea_jax.fit_proxy import FIT_FILE


def load_config_file(spec: str):
  """``get_config`` of the config file ``path[:argument]``."""
  path, _, arg = spec.partition(":")
  module_spec = importlib.util.spec_from_file_location("proxy_base_config", path)
  if module_spec is None or not os.path.exists(path):
    raise ValueError(f"config file {path!r} (recorded in {FIT_FILE}) does not exist; run from "
                     "the directory the probes were run from")
  module = importlib.util.module_from_spec(module_spec)
  module_spec.loader.exec_module(module)
  return module.get_config(arg) if arg else module.get_config()


def get_config(fit_dir: str | None = None):
  """The recorded config file's run under the fitted schedule of ``<fit_dir>/proxy_fit.json``."""
  if not fit_dir:
    raise ValueError("experiments/proxy.py needs the fit's directory: "
                     "--config=experiments/proxy.py:runs/proxy")
  path = os.path.join(fit_dir, FIT_FILE)
  if not os.path.exists(path):
    raise ValueError(f"{path} does not exist: run python -m andrea_jax.fit_proxy "
                     f"--workdir={fit_dir} first")
  with open(path) as f:
    fit = json.load(f)
  if not fit.get("config_file"):
    raise ValueError(f"{path} records no config file to train")
  c = load_config_file(fit["config_file"])
  c.curriculum.strategy = "static"
  # "Then uniform": the second part holds static_mixture, whatever the config file set it to.
  for k in c.curriculum.static_mixture:
    c.curriculum.static_mixture[k] = 1.0
  c.curriculum.geometries = proxy.proxy_schedule(fit["mixture"], int(c.train.num_steps),
                                                 hold=fit["hold"], sources=fit["sources"])
  return c
