r"""A run under a mixture fitted on small proxy runs (``python -m study.mixing.fit_proxy``).

  python -m study.mixing.fit_proxy --config=experiments/synthetic.py --workdir=runs/proxy \
      --config.model.num_layers=2 --config.model.d_model=64 --config.model.d_mlp=256
  python -m andrea_jax.main --config=study/mixing/proxy_config.py:runs/proxy --workdir=runs/with_proxy

The argument is the fit's workdir. The run is the config file the probes were made from (as
recorded in ``proxy_fit.json``, without the probes' command-line overrides: the target keeps its
own model), with the static strategy holding the fitted mixture on the full simplex for the first
``hold`` of its steps, then the uniform mixture. Override anything on the command line as usual;
the switch to uniform is ``curriculum.geometries.uniform.start_step`` (set from the config
file's ``train.num_steps``), each fitted weight ``curriculum.geometries.proxy.mixture.<source>``.

Fits of the same config and recipe (probes, stop, late, ratio, lam, power, hold) at two or more
proxy sizes, comma-separated
(``study/mixing/proxy_config.py:runs/proxy_2x64,runs/proxy_4x128``), are read at the config file's model
size: per source, ``b`` as a line in the log of the parameter count through the fits
(``proxy.scale_elasticity``), then the fits' shared ``lam`` and ``power``. The size is the config
file's model: ``--config.model.*`` overrides of the run come after the mixture is made.

Expect, on the built-in corpus (``study/mixing/LOG.md``, "A designed proxy", "A sharper mixture"),
the uniform mixture's final held-out loss reached in fewer steps than under the uniform mixture:
with ``--power 1.5`` (the default), 23.4% when the probes are the target's own size (0.13M, nine
seeds), 23.2% at 0.85M with probes of its size (nine seeds) and 18.7% at 2.76M (nine) from fits
at 0.13M and 0.85M read at its size; 17-20% from a 0.13M fit alone at 0.85-2.76M.
"""

import json
import os

from study.mixing import proxy
from andrea_jax.config import load_config_file
from andrea_jax.curriculum import set_mixer
from study.mixing.fit_proxy import FIT_FILE


def _read_fit(fit_dir: str) -> dict:
  path = os.path.join(fit_dir, FIT_FILE)
  if not os.path.exists(path):
    raise ValueError(f"{path} does not exist: run python -m study.mixing.fit_proxy "
                     f"--workdir={fit_dir} first")
  with open(path) as f:
    fit = json.load(f)
  fit["path"] = path
  if not fit.get("config_file"):
    raise ValueError(f"{path} records no config file to train")
  return fit


def _scaled_mixture(fits: list[dict], target_params: int) -> list[float]:
  """The fits' elasticities read at ``target_params`` (:func:`proxy.scale_elasticity`), then their
  shared ``lam`` and ``power`` (:func:`proxy.elasticity_mixture`)."""
  first = fits[0]
  for fit in fits:
    if "num_params" not in fit or "b" not in fit:
      raise ValueError(f"{fit['path']} records no {'num_params' if 'b' in fit else 'b'}: fit it "
                       "again with this version of python -m study.mixing.fit_proxy (its probes "
                       "are reused)")
    # The fields that make b mean the same thing (the probes' design, length and window) and the
    # mixture the same schedule.
    for field in ("sources", "config_file", "lam", "power", "hold", "num_steps", "probes", "stop",
                  "late", "ratio"):
      if fit.get(field) != first.get(field):
        raise ValueError(f"the fits disagree on {field}: {first.get(field)!r} in "
                         f"{first['path']}, {fit.get(field)!r} in {fit['path']}")
  by_size = {}
  for fit in fits:
    other = by_size.setdefault(fit["num_params"], fit)
    if other is not fit:
      raise ValueError(f"{other['path']} and {fit['path']} are fits of the same size "
                       f"(num_params {fit['num_params']}): a size line needs distinct sizes")
  b = proxy.scale_elasticity([f["num_params"] for f in fits], [f["b"] for f in fits],
                             target_params)
  return proxy.elasticity_mixture(b, lam=first["lam"], power=first["power"]).tolist()


def get_config(fit_dirs: str | None = None):
  """The recorded config file's run under the fitted schedule of ``<fit_dir>/proxy_fit.json``;
  given several fit directories (``runs/proxy_small,runs/proxy_large``: fits of the same config
  at two or more proxy sizes), under the mixture of their elasticities read at the config file's
  model size."""
  if not fit_dirs:
    raise ValueError("study/mixing/proxy_config.py needs the fit's directory: "
                     "--config=study/mixing/proxy_config.py:runs/proxy")
  dirs = fit_dirs.split(",")
  if not all(dirs):
    raise ValueError(f"study/mixing/proxy_config.py:{fit_dirs}: an empty fit directory in the list")
  fits = [_read_fit(d) for d in dirs]
  c = load_config_file(fits[0]["config_file"])
  mixture = fits[0]["mixture"]
  if len(fits) > 1:
    from study.mixing.fit_proxy import model_params
    mixture = _scaled_mixture(fits, model_params(c))
  # "Then uniform": the second part holds the static mixer's mixture, uniform, whatever the
  # config file set.
  set_mixer(c, "static")
  c.curriculum.geometries = proxy.proxy_schedule(mixture, int(c.train.num_steps),
                                                 hold=fits[0]["hold"], sources=fits[0]["sources"])
  return c
