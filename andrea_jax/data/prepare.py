"""Command line: tokenize a config's sources into token shards and a manifest.

The config file's ``data`` section is :func:`andrea_jax.data.config.data_config`, checked into a
:class:`~andrea_jax.data.config.DataSpec`; the work is done by
:func:`andrea_jax.data.prepare_lib.prepare` (see there for what is guaranteed)::

  python -m andrea_jax.data.prepare --config experiments/andrea120m.py:v3
  python -m andrea_jax.data.prepare --config my_config.py --config.data.workers=16 --out DIR

Without ``--out`` the files are prepared where a run of the same config reads them (under
``data.cache_dir``; :func:`andrea_jax.data.pipeline.files_prepared_dir`), so the training command
needs nothing more: prepare once, ahead of a long run (on several hosts, with a ``data.cache_dir``
they share). ``--out DIR`` writes elsewhere, for a run given ``data.prepared_dir=DIR`` and no
``data.files``. A second run into the same directory redoes only the sources whose inputs changed
(a changed ``max_tokens`` included). ``--config.data.files.<source>.format=...`` switches a source's
format, as for a run.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from absl import app, flags
from absl import logging  # noqa: F401  (defines --verbosity, read on failure)
from ml_collections import config_flags

from andrea_jax.data import formats
from andrea_jax.data.config import data_spec, without_data
from andrea_jax.data.pipeline import files_prepared_dir, prepare_from_config
from andrea_jax.data.prepare_lib import PrepareResult, prepare  # re-exported for convenience
from andrea_jax.sources import SOURCES
from andrea_jax.storage import WriteError

__all__ = ["PrepareResult", "main", "prepare"]


def main(argv: Sequence[str]) -> None:
  """``python -m andrea_jax.data.prepare --config FILE [--out DIR]``: prepares the config's data."""
  del argv
  cfg, out = flags.FLAGS.config, flags.FLAGS.out
  data = cfg.data if "data" in cfg else cfg
  sources = cfg.sources if "sources" in cfg else SOURCES   # a file with a data section alone
  try:
    spec = data_spec(data, sources)   # the section, checked once; the tokenizer loaded
    empty = without_data(spec, sources)
    if empty:   # prepared in parts, perhaps: said, not refused (a run refuses to start without)
      print(f"no data configured for {empty}: not prepared (set data.files.<source>.paths, or "
            ".format='hf' with .dataset)", file=sys.stderr)
    if not out:
      if spec.corpus != "files":
        raise app.UsageError(f"--out is needed for data.corpus = {data.corpus!r} (a built-in "
                             "corpus is prepared by the run itself)")
      if spec.prepared_dir:
        raise app.UsageError(f"--out is needed with data.prepared_dir = {data.prepared_dir!r} "
                             "(a run reads that directory as it is)")
      out = files_prepared_dir(spec)
    result = prepare_from_config(spec, out, progress=True)
  # DataError included: the message names file and byte; WriteError: a full disk, naming the file.
  except (ValueError, TypeError, WriteError) as e:
    if flags.FLAGS["verbosity"].present:
      raise
    kept = f"finished sources in {out} are kept; " if out else ""
    print(f"error: {e}\n({kept}--verbosity=0 shows the traceback)", file=sys.stderr)
    sys.exit(1)
  m = result.manifest
  print(f"{out}: tokenizer {m['tokenizer']['name']}, dtype {m['dtype']}; prepared "
        f"{list(result.prepared)}, already finished {list(result.skipped)}")
  for name, e in m["sources"].items():
    counted = (f" ({e['loss_tokens']['train']} counted by the loss, loss_on {e['loss_on']!r})"
               if "loss_tokens" in e else "")
    print(f"  {name:18s} {e['documents']['train']:>9d} train docs {e['tokens']['train']:>13d} "
          f"train tokens {e['tokens']['eval']:>11d} eval tokens in {len(e['shards']['train'])} "
          f"shard(s){counted}")


if __name__ == "__main__":
  # Defined here, not at import, so that importing this module never clashes with a trainer's flags.
  config_flags.DEFINE_config_file("config", None, "config file with a `data` section",
                                  lock_config=True)
  # --config.data.files.<source>.format=<format> remakes that section before the other overrides.
  formats.switch_on_parse(flags.FLAGS["config"])
  flags.DEFINE_string("out", None, "directory to write the prepared shards and manifest to "
                      "(default: where a run of this config reads them, under data.cache_dir)")
  flags.mark_flags_as_required(["config"])
  app.run(main)
