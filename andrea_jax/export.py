r"""A run as a folder ``transformers`` and lm-evaluation-harness load: weights, config, tokenizer.

  python -m andrea_jax.export --workdir runs/tiny --out runs/tiny-hf            # newest checkpoint
  python -m andrea_jax.export --workdir runs/tiny --step 500 --out runs/tiny-500-hf --force

(``andrea-export`` is the same command.) The folder stands alone:

* ``model.safetensors`` -- float32, the tied output layer stored once, the padded vocabulary rows
  cut (:func:`andrea_jax.convert.save_safetensors`);
* ``config.json`` -- ``GPT2LMHeadModel``'s, with the real vocabulary size, ``n_positions =
  model.max_len`` and the end-of-document id as ``bos_token_id`` and ``eos_token_id``;
* ``generation_config.json``, ``tokenizer.json`` and ``tokenizer_config.json`` -- so that
  ``AutoTokenizer.from_pretrained(out)`` encodes exactly as the run did, and ``generate`` stops at
  the end of a document; the chat template of a run trained on conversations in
  ``tokenizer_config.json`` (:mod:`andrea_jax.hf_files`; a SentencePiece tokenizer is not written,
  and the model card says so);
* ``README.md`` -- a model card: the run, the step, the sources, the tokenizer, the weights'
  SHA-256, the weights it started from; ``andrea_run.json`` -- the same for programs, with the run's
  whole config.

The folder is written in a temporary sibling and renamed into place once whole: a failure or a kill
leaves ``--out`` as it was. A non-empty ``--out`` is refused unless ``--force`` (which replaces it,
also only once the new folder is whole). Bad input ends with one ``error:`` line naming the flag,
the file or the step.

Then, in Python:

  from transformers import pipeline
  print(pipeline("text-generation", "runs/tiny-hf")("The ", max_new_tokens=20))
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from andrea_jax import convert
from andrea_jax import hf_files
from andrea_jax import pretrained
from andrea_jax import storage
from andrea_jax import trained
from andrea_jax.model import count_params

CARD_NAME = "README.md"
PROVENANCE_NAME = "andrea_run.json"


def model_card(model: trained.TrainedModel, sha256: str, template_name: str | None,
               tokenizer_written: bool) -> str:
  """The folder's ``README.md``: what the model is and where it came from."""
  run = model.run_config or {}
  init = {k: v for k, v in (run.get("init") or {}).items() if v not in ("", None)}
  rows = [("run", f"`{model.origin}`"), ("step", model.step),
          ("sources", ", ".join(run.get("sources") or []) or "-"),
          ("tokenizer", f"`{model.tokenizer.name}`" + ("" if tokenizer_written else
                                                      " (SentencePiece: not exported)")),
          ("chat template", template_name or "none (not trained on conversations)"),
          ("parameters", f"{count_params(model.params):,} (vocabulary padding included)"),
          ("model.safetensors SHA-256", f"`{sha256}`"),
          ("started from", ", ".join(f"{k} `{v}`" for k, v in init.items()) or "random weights")]
  table = "\n".join(f"| {k} | {v} |" for k, v in rows)
  c = model.config
  tokenizer_note = ("" if tokenizer_written else
                    "\nThe run's SentencePiece tokenizer has no `tokenizer.json`: this folder has "
                    "no tokenizer; encode with the run's `.model` file.\n")
  return f"""---
library_name: transformers
tags: [andrea_jax, gpt2]
---
# {os.path.basename(model.origin.rstrip(os.sep))}, step {model.step}

A GPT-2-layout decoder ({c.num_layers} layers, {c.num_heads} heads, d_model {c.d_model}, context
{c.max_len}, vocabulary {c.vocab_size}) trained with andrea_jax and exported by
`python -m andrea_jax.export`.

| | |
| --- | --- |
{table}
{tokenizer_note}
```python
from transformers import AutoModelForCausalLM, AutoTokenizer
model = AutoModelForCausalLM.from_pretrained("path/to/this/folder")
tokenizer = AutoTokenizer.from_pretrained("path/to/this/folder")
```

`andrea_run.json` holds the run's whole configuration.
"""


def write_folder(model: trained.TrainedModel, out: str, *, force: bool = False) -> dict[str, Any]:
  """Writes ``model`` as a Hugging Face folder at ``out`` (see the module docstring); returns
  ``{"out", "files", "sha256", "step", "chat_template"}``.

  Raises ``FileExistsError`` for a non-empty ``out`` without ``force``, before anything is
  written; a failed write leaves ``out`` as it was.

  Example:
    >>> write_folder(trained.from_workdir("runs/tiny"), "runs/tiny-hf")["files"][:2]
    ['model.safetensors', 'config.json']
  """
  if os.path.isdir(out) and os.listdir(out) and not force:
    raise FileExistsError(f"--out {out} is not empty; pass --force to replace it")
  template = model.chat_template() if model.template_spec is not None else None
  if hf_files.tokenizer_json(model.tokenizer) is None:
    print(f"warning: the tokenizer {model.tokenizer.name} is SentencePiece, which transformers "
          "would encode differently: the folder gets no tokenizer (the model card says so)",
          file=sys.stderr)
  with storage.staged_directory(out, f"nothing was written to {out}", replace=force) as tmp:
    files, sha = _write_files(model, tmp, template)
  return {"out": os.path.abspath(out), "files": files, "sha256": sha, "step": model.step,
          "chat_template": template.name if template is not None else None}


def _write_files(model: trained.TrainedModel, folder: str, template) -> tuple[list[str], str]:
  """Every file of the export into ``folder``; ``(names, SHA-256 of model.safetensors)``."""
  convert.save_safetensors(model.params, model.config, folder, eod_id=model.tokenizer.eod_id)
  files = ["model.safetensors", "config.json"]
  written = hf_files.write_tokenizer_files(folder, model.tokenizer, model.config.max_len,
                                           template)
  files += written
  sha = pretrained.file_sha256(os.path.join(folder, "model.safetensors"))
  name = template.name if template is not None else None
  provenance = {"origin": model.origin, "step": model.step, "sha256": sha,
                "tokenizer": model.tokenizer.name, "chat_template": name,
                "config": model.run_config}
  card = model_card(model, sha, name, "tokenizer.json" in written)
  for file, text in ((PROVENANCE_NAME, json.dumps(provenance, indent=2, default=str)),
                     (CARD_NAME, card)):
    storage.atomic_write(os.path.join(folder, file), text, f"{file} was not written")
    files.append(file)
  return files, sha


def export_run(workdir: str, out: str, step: int | None = None, *, force: bool = False
               ) -> dict[str, Any]:
  """:func:`write_folder` of checkpoint ``step`` (default the newest) of the run in ``workdir``.

  Example:
    >>> export_run("runs/tiny", "runs/tiny-hf")["sha256"]
  """
  if os.path.isdir(out) and os.listdir(out) and not force:   # before reading the checkpoint
    raise FileExistsError(f"--out {out} is not empty; pass --force to replace it")
  return write_folder(trained.from_workdir(workdir, step), out, force=force)


def parser() -> argparse.ArgumentParser:
  p = argparse.ArgumentParser(prog="python -m andrea_jax.export",
                              description=__doc__.splitlines()[0])
  p.add_argument("--workdir", required=True, help="the run's directory (holds checkpoints/)")
  p.add_argument("--step", type=int, default=None, help="checkpoint step (default: the newest)")
  p.add_argument("--out", required=True, help="the folder to write (absent or empty)")
  p.add_argument("--force", action="store_true", help="replace a non-empty --out")
  return p


def main(argv: list[str] | None = None) -> int:
  """The command line; bad input ends with one ``error:`` line (exit status 1)."""
  args = parser().parse_args(argv)
  from andrea_jax.checkpoint import CheckpointError
  from andrea_jax.data import DataError
  try:
    done = export_run(args.workdir, args.out, args.step, force=args.force)
  except (ValueError, TypeError, OSError, DataError, CheckpointError) as e:
    print(f"error: {e}", file=sys.stderr)
    return 1
  print(f"exported {args.workdir} step {done['step']} to {done['out']}: "
        f"{', '.join(done['files'])}"
        + (f" (chat template: {done['chat_template']})" if done["chat_template"] else ""))
  return 0


def run() -> None:
  """Entry point of ``andrea-export``."""
  sys.exit(main())


if __name__ == "__main__":
  run()
