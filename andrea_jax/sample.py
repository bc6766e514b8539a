r"""Text from a trained model: a run's checkpoint or a Hugging Face GPT-2 folder.

  python -m andrea_jax.sample --workdir runs/tiny --prompt "The "            # newest checkpoint
  python -m andrea_jax.sample --workdir runs/tiny --step 500 --prompt_file p.txt --num_samples 3 \
      --temperature 0.8 --top_k 200 --top_p 0.95 --seed 1
  python -m andrea_jax.sample --workdir runs/chat --chat --prompt "What is a list?" --greedy
  python -m andrea_jax.sample --hf runs/tiny-hf --prompt "def " --json

(``andrea-sample`` is the same command.) The prompt is encoded after the end-of-document id, as
every training document starts (an empty prompt is that id alone); ``--chat`` first wraps it in the
model's chat template as one user message with the assistant's turn opened
(``add_generation_prompt``), the template the run trained on (a folder's, from its
``tokenizer_config.json``). Each sample stops at the end-of-document id or after
``--max_new_tokens`` (default: as many as fit in the context, at most 256).

Sampling (:func:`andrea_jax.generate.generate`, one program for all the samples): the temperature,
then ``--top_k`` (the k most probable ids), then ``--top_p`` (the nucleus: the fewest most probable
ids whose renormalised probability reaches p), as ``transformers`` applies them; ``--greedy`` takes
the most probable id (what ``transformers``' ``generate(do_sample=False)`` gives on the exported
folder). The same ``--seed`` gives the same samples. The settings and the source go to stderr, each
sample to stdout followed by a line of dashes; ``--json`` prints one JSON object instead
(``{"source", "step", "settings", "prompt_ids", "samples": [{"text", "ids", "stopped_at_eod"}]}``).

Bad input (a prompt that leaves no room for ``--max_new_tokens`` in the context, a temperature that
is not > 0, a top-p outside (0, 1]) ends with one ``error:`` line that names the flag and the
numbers.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import jax
import numpy as np

from andrea_jax import checks
from andrea_jax import generate as gen_lib
from andrea_jax import trained

DEFAULT_NEW_TOKENS = 256
SEPARATOR = "-" * 15
# One program per (model config, number of samples, prompt length, settings).
_GENERATE = jax.jit(gen_lib.generate, static_argnames=("config", "max_new_tokens", "top_k",
                                                       "greedy", "vocab_limit", "top_p"))


def prompt_ids(model: trained.TrainedModel, prompt: str, *, chat: bool = False) -> np.ndarray:
  """``[P]`` int32: the end-of-document id, then the prompt's ids (after the chat template with
  the assistant's turn opened, with ``chat``).

  Example:
    >>> prompt_ids(from_workdir("runs/tiny"), "The ").tolist()   # bytes: eod = 256
    [256, 84, 104, 101, 32]
  """
  if chat:
    from andrea_jax.data.hub.templates import render_chat
    prompt = render_chat(model.chat_template(), [{"role": "user", "content": prompt}],
                         add_generation_prompt=True)
  return np.concatenate([[model.tokenizer.eod_id], model.tokenizer.encode(prompt)]).astype(
      np.int32)


def check_settings(model: trained.TrainedModel, num_prompt: int, *, num_samples: int,
                   max_new_tokens: int | None, temperature: float, top_k: int | None,
                   top_p: float | None, greedy: bool) -> int:
  """The number of new tokens, once every setting is valid; ``ValueError`` naming the flag and
  the numbers otherwise, ``TypeError`` for a value of the wrong type (``max_new_tokens=None``: as
  many as fit, at most 256)."""
  max_len = model.config.max_len
  room = max_len - num_prompt
  if room < 1:
    raise ValueError(f"the prompt is {num_prompt} tokens (with the end-of-document id), and the "
                     f"model's context holds {max_len}: no room for a new token; shorten it")
  if max_new_tokens is None:
    max_new_tokens = min(room, DEFAULT_NEW_TOKENS)
  max_new_tokens = checks.integer("--max_new_tokens", max_new_tokens, minimum=1)
  if max_new_tokens > room:
    raise ValueError(f"the prompt is {num_prompt} tokens (with the end-of-document id) and "
                     f"--max_new_tokens {max_new_tokens} asks for {num_prompt + max_new_tokens} "
                     f"positions, more than the model's context of {max_len}: lower "
                     f"--max_new_tokens to {room} or shorten the prompt")
  checks.integer("--num_samples", num_samples, minimum=1)
  if not greedy:
    checks.number("--temperature", temperature, low=0, low_open=True,
                  hint="--greedy takes the most probable token")
    gen_lib.check_top_p(top_p)
    checks.integer("--top_k", top_k, minimum=1, maximum=model.vocab_limit, optional=True,
                   hint="the vocabulary")
  return max_new_tokens


def sample(model: trained.TrainedModel, prompt: str, *, num_samples: int = 1,
           max_new_tokens: int | None = None, temperature: float = 1.0, top_k: int | None = None,
           top_p: float | None = None, greedy: bool = False, seed: int = 0,
           chat: bool = False) -> dict[str, Any]:
  """``num_samples`` continuations of ``prompt``, each cut at the first end-of-document id.

  Returns ``{"prompt_ids", "max_new_tokens", "samples": [{"text", "ids", "stopped_at_eod"}]}``
  (``ids``: the new ids, the end-of-document id excluded). Raises ``ValueError`` naming the
  setting for bad input (:func:`check_settings`).

  Example:
    >>> sample(trained.from_hf("runs/tiny-hf"), "The ", greedy=True, max_new_tokens=20)
  """
  ids_P = prompt_ids(model, prompt, chat=chat)
  n = check_settings(model, len(ids_P), num_samples=num_samples, max_new_tokens=max_new_tokens,
                     temperature=temperature, top_k=top_k, top_p=top_p, greedy=greedy)
  prompt_BxP = np.tile(ids_P[None], (num_samples, 1))
  out_BxT = np.asarray(_GENERATE(model.params, model.config, prompt_BxP, jax.random.PRNGKey(seed),
                           max_new_tokens=n, temperature=temperature, top_k=top_k,
                           greedy=greedy, vocab_limit=model.vocab_limit, top_p=top_p))
  samples = []
  eod = model.tokenizer.eod_id
  for row in out_BxT[:, len(ids_P):]:
    stop = np.flatnonzero(row == eod)
    new = row[:stop[0]] if stop.size else row
    samples.append({"text": model.tokenizer.decode(new), "ids": new.tolist(),
                    "stopped_at_eod": bool(stop.size)})
  return {"prompt_ids": ids_P.tolist(), "max_new_tokens": n, "samples": samples}


def parser() -> argparse.ArgumentParser:
  p = argparse.ArgumentParser(prog="python -m andrea_jax.sample",
                              description=__doc__.splitlines()[0])
  p.add_argument("--workdir", default=None, help="a run's directory (holds checkpoints/)")
  p.add_argument("--step", type=int, default=None, help="its checkpoint (default: the newest)")
  p.add_argument("--hf", default=None, help="a Hugging Face GPT-2 folder, or hf:<repo>")
  p.add_argument("--prompt", default=None, help="the text to continue (default: empty)")
  p.add_argument("--prompt_file", default=None, help="a file whose text is the prompt")
  p.add_argument("--chat", action="store_true", help="wrap the prompt in the chat template")
  p.add_argument("--num_samples", type=int, default=1, help="samples drawn")
  p.add_argument("--max_new_tokens", type=int, default=None,
                 help=f"tokens per sample (default: as many as fit, at most {DEFAULT_NEW_TOKENS})")
  p.add_argument("--temperature", type=float, default=0.8, help="divides the logits (> 0)")
  p.add_argument("--top_k", type=int, default=None, help="draw among the k most probable ids")
  p.add_argument("--top_p", type=float, default=None, help="nucleus sampling, in (0, 1]")
  p.add_argument("--greedy", action="store_true", help="the most probable id at each step")
  p.add_argument("--seed", type=int, default=0, help="the samples' random seed")
  p.add_argument("--json", action="store_true", help="one JSON object on stdout")
  return p


def _prompt(args: argparse.Namespace) -> str:
  if args.prompt is not None and args.prompt_file is not None:
    raise ValueError("give --prompt or --prompt_file, not both")
  if args.prompt_file is None:
    return args.prompt or ""
  with open(args.prompt_file, encoding="utf-8") as f:
    return f.read()


def main(argv: list[str] | None = None) -> int:
  """The command line; bad input ends with one ``error:`` line (exit status 1)."""
  args = parser().parse_args(argv)
  from andrea_jax.checkpoint import CheckpointError
  from andrea_jax.data import DataError
  settings = {k: getattr(args, k) for k in ("num_samples", "max_new_tokens", "temperature",
                                            "top_k", "top_p", "greedy", "seed", "chat")}
  try:
    prompt = _prompt(args)
    model = trained.load(args.workdir, args.step, args.hf)
    out = sample(model, prompt, **settings)
  except (ValueError, TypeError, OSError, DataError, CheckpointError) as e:
    print(f"error: {e}", file=sys.stderr)
    return 1
  settings["max_new_tokens"] = out["max_new_tokens"]
  if args.json:
    print(json.dumps({"source": model.origin, "step": model.step, "settings": settings,
                      "prompt_ids": out["prompt_ids"], "samples": out["samples"]},
                     ensure_ascii=False))
    return 0
  shown = ", ".join(f"{k} {v}" for k, v in settings.items() if v not in (None, False))
  print(f"{model.origin}, step {model.step}: {shown}", file=sys.stderr)
  for s in out["samples"]:
    print(prompt + s["text"])
    print(SEPARATOR)
  return 0


def run() -> None:
  """Entry point of ``andrea-sample``."""
  sys.exit(main())


if __name__ == "__main__":
  run()
