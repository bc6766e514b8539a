r"""The study's corpus: pieces of the ``stdlib`` corpus, one JSONL file per source, leak-checked.

  python -m study.data_constrained.prep --out runs/data_constrained/pieces

Cut from :func:`andrea_jax.data.corpora.stdlib.stdlib_documents` (the same bytes on every machine
with the same CPython build); sizes in byte-tokenizer tokens (a document's UTF-8 bytes plus its
end-of-document id):

==================== ==========================================================================
``doc-dev``          never trained on (``eval.untrained``): the first docstrings in a fixed hash
                     order (:func:`hash_order`) until :data:`DEV_TOKENS`, split into two halves
                     of near-equal tokens (:func:`halves`). ``eval_fraction =
                     0.5`` puts dev-A in its training split (the target gain's target rows) and
                     dev-B at its held-out positions (``eval/target_loss``: the selection metric)
``doc-small``        the target's training data: the next docstrings in the hash order until
                     :data:`TARGET_TOKENS` (``--target-tokens``); a few more at its held-out
                     positions (its ``eval/loss``, not used by the protocol). doc-dev and
                     doc-small take documents of at most :data:`MAX_DOC_TOKENS` tokens only
``doc-test``         never trained on: the docstrings the ``stdlib`` corpus holds out, all at the
                     held-out positions (``eval/loss/doc-test``: the score and nothing else); a
                     one-line filler at each training position (never read)
``noisy-docstrings`` the corpus's corrupted copies of the docstrings training documents, minus
                     the twin of every docstring written to any piece above
``reference``,       as in ``stdlib`` (the same documents in the same order, the same held-out
``python-code``,     documents)
``licenses``
``doc-plus-dev``     (the optional arm ``target_only_dev``) doc-small's training documents and
                     all of doc-dev's, trained on; doc-small's held-out documents (and the next
                     in the hash order, as many as its rule holds out) held out
==================== ==========================================================================

The docstrings the pieces leave out stand for target data the practitioner does not have: only
their noisy twins exist. :func:`check_leakage` refuses pieces where a dev or test document is a
substring of any document of a training piece, where dev and test share a document, or where a
noisy document is the twin of a docstring written to a piece (every noisy document's origin is
found by re-making the corpus's corruption, :func:`twins`). Held-out positions are placed by the
product's own rule (:func:`andrea_jax.data.prepare_lib.eval_mask`, keyed by the source's name):
:func:`place` orders a piece's documents so that the rule holds out exactly the chosen ones.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
from collections.abc import Mapping, Sequence
from typing import NamedTuple

import numpy as np

from andrea_jax import storage
from andrea_jax.data.corpora import stdlib as sc
from andrea_jax.data.corpora.corrupt import corrupt_text
from andrea_jax.data.hashing import hash_key, name_key, splitmix64
from andrea_jax.data.prepare_lib import eval_mask

TARGET_TOKENS = 32_000      # doc-small's training tokens, at least (the design's ~32K)
DEV_TOKENS = 32_000         # doc-dev's tokens, at least: ~16K per half
# A doc-dev or doc-small document is at most this long (a longer one stays with the dropped): one
# docstring of 13.7K tokens, early in the hash order, would otherwise be most of one dev half's
# 16K (the selection metric or the gain's target), or all of an 8K doc-small.
MAX_DOC_TOKENS = 4096
ORDER_SALT = name_key("study/data_constrained: docstrings order")
EVAL_FRACTION = {"doc-small": 0.02, "doc-dev": 0.5, "doc-test": 0.5, "doc-plus-dev": 0.02,
                 "noisy-docstrings": sc.STDLIB_EVAL_FRACTION, "reference": sc.STDLIB_EVAL_FRACTION,
                 "python-code": sc.STDLIB_EVAL_FRACTION, "licenses": sc.STDLIB_EVAL_FRACTION}
"""Each piece's ``data.files.<source>.eval_fraction`` (the placement below depends on it)."""
PIECES = tuple(EVAL_FRACTION)
READ_AS = {"doc-plus-dev": "doc-small"}
"""The source name a piece is read under when it is not its own (``target_only_dev`` reads
doc-plus-dev as doc-small): the held-out rule is keyed by the source's name."""
TRAINING = ("doc-small", "noisy-docstrings", "reference", "python-code", "licenses")
"""The pieces some arm trains on (``doc-plus-dev`` too, for its own arm)."""
FILLER = "(filler: doc-test's held-out documents sit at the other positions; never read)"
MANIFEST = "pieces.json"


def tokens(doc: str) -> int:
  """A document's byte-tokenizer tokens: its UTF-8 bytes and the end-of-document id."""
  return len(doc.encode("utf-8")) + 1


def hash_order(n: int, salt: int = ORDER_SALT) -> np.ndarray:
  """``[n]`` int64: the indices ``0..n-1`` sorted by ``splitmix64(salt ^ i)`` (a fixed shuffle,
  the same on every machine)."""
  key_N = splitmix64(np.arange(n, dtype=np.uint64) ^ np.uint64(salt))
  return np.argsort(key_N, kind="stable").astype(np.int64)


def held_count(source: str, num_train: int, fraction: float) -> int:
  """The least ``h >= 1`` such that ``eval_mask`` holds out exactly ``h`` of ``num_train + h``
  documents of ``source``."""
  for h in range(1, num_train + 2):
    if int(eval_mask(source, 0, num_train + h, fraction).sum()) == h:
      return h
  raise ValueError(f"no held-out count fits {num_train} training documents of {source!r} at "
                   f"eval_fraction {fraction}")


def place(source: str, train: Sequence[str], held: Sequence[str], fraction: float) -> list[str]:
  """``train`` and ``held`` in one document order that ``eval_mask(source, ..., fraction)`` splits
  back into them (each list's order kept). ``len(held)`` must be the count the rule holds out of
  ``len(train) + len(held)`` documents.

  Example: at fraction 0.5 every block of two documents holds one out, so
  ``place("x", ["a", "b"], ["A", "B"], 0.5)`` interleaves them as the mask of "x" says.
  """
  held_D = eval_mask(source, 0, len(train) + len(held), fraction)
  if int(held_D.sum()) != len(held):
    raise ValueError(f"{source!r}: the rule holds out {int(held_D.sum())} of "
                     f"{len(train) + len(held)} documents at eval_fraction {fraction}, not "
                     f"{len(held)}")
  it_train, it_held = iter(train), iter(held)
  return [next(it_held) if h else next(it_train) for h in held_D]


def split(source: str, documents: Sequence[str], fraction: float) -> tuple[list[str], list[str]]:
  """``(training, held_out)`` documents of a piece, as the product's preparation splits them."""
  held_D = eval_mask(source, 0, len(documents), fraction)
  return ([d for d, h in zip(documents, held_D) if not h],
          [d for d, h in zip(documents, held_D) if h])


def twins(docstrings: Sequence[str]) -> dict[str, int]:
  """Every noisy copy the ``stdlib`` corpus makes, ``text -> index`` of the docstring it copies
  (its training documents only, as :func:`stdlib.documents_from_inputs` makes them)."""
  held_D = eval_mask(sc.NOISY_OF, 0, len(docstrings), sc.STDLIB_EVAL_FRACTION)
  return {corrupt_text(d, sc.NOISE_RATE, hash_key(sc.NOISE_SEED, i)): i
          for i, (d, held) in enumerate(zip(docstrings, held_D)) if not held}


class Pieces(NamedTuple):
  """The pieces: ``documents[source]`` in file order; ``roles`` names the docstrings (indices into
  the corpus's ``docstrings``) each role took."""
  documents: dict[str, list[str]]
  roles: dict[str, list[int]]


def _take(order: Sequence[int], docs: Sequence[str], start: int, budget: int,
          even: bool = False, max_doc: int | None = None) -> tuple[list[int], int]:
  """Indices from ``order[start:]`` until ``budget`` tokens (an even count if ``even``), skipping
  documents longer than ``max_doc`` tokens (they stay with the dropped ones)."""
  out, total, k = [], 0, start
  while total < budget or (even and len(out) % 2):
    i = int(order[k])
    k += 1
    if max_doc is None or tokens(docs[i]) <= max_doc:
      out.append(i)
      total += tokens(docs[i])
  return out, k


def halves(idx: Sequence[int], docs: Sequence[str]) -> tuple[list[int], list[int]]:
  """``idx`` (an even count) in two halves of equal counts and near-equal tokens: by size, two at
  a time, the larger of each pair to the half with fewer tokens so far; each half keeps ``idx``'s
  order.

  Example: sizes 10, 9, 5, 4 give halves {10, 4} and {9, 5}.
  """
  by_size = sorted(idx, key=lambda i: -tokens(docs[i]))   # stable: ties keep idx's order
  a, b, ta, tb = set(), set(), 0, 0
  for big, small in zip(by_size[0::2], by_size[1::2]):
    if ta <= tb:
      a.add(big), b.add(small)
    else:
      b.add(big), a.add(small)
    ta, tb = sum(tokens(docs[i]) for i in a), sum(tokens(docs[i]) for i in b)
  return [i for i in idx if i in a], [i for i in idx if i in b]


def cut(corpus: Mapping[str, Sequence[str]], target_tokens: int = TARGET_TOKENS) -> Pieces:
  """The pieces from the ``stdlib`` corpus's documents (:func:`stdlib.stdlib_documents`), with
  doc-small of at least ``target_tokens`` training tokens."""
  doc = list(corpus["docstrings"])
  held_D = eval_mask(sc.NOISY_OF, 0, len(doc), sc.STDLIB_EVAL_FRACTION)
  train_idx = np.flatnonzero(~held_D)
  test_idx = [int(i) for i in np.flatnonzero(held_D)]
  order = train_idx[hash_order(train_idx.size)]
  # dev first, so that it is the same whatever the target's size (and a smaller doc-small is a
  # prefix of a larger one)
  dev, k = _take(order, doc, 0, DEV_TOKENS, even=True, max_doc=MAX_DOC_TOKENS)
  small, k = _take([i for i in order if int(i) not in dev], doc, 0, target_tokens,
                   max_doc=MAX_DOC_TOKENS)
  rest = [int(i) for i in order if int(i) not in dev][k:]
  n_small_held = held_count("doc-small", len(small), EVAL_FRACTION["doc-small"])
  small_held = rest[:n_small_held]
  dev_a, dev_b = halves(dev, doc)
  # doc-plus-dev holds out doc-small's held-out documents and, if its rule wants more, the next.
  n_plus_held = held_count(READ_AS["doc-plus-dev"], len(small) + len(dev),
                           EVAL_FRACTION["doc-plus-dev"])
  extra = max(0, n_plus_held - len(small_held))
  plus_held = (small_held + rest[n_small_held:n_small_held + extra])[:n_plus_held]
  text = lambda idx: [doc[i] for i in idx]
  written = set(small + dev + small_held + plus_held + test_idx)
  origin = twins(doc)
  noisy = [d for d in corpus[sc.NOISY_SOURCE] if origin.get(d) not in written]
  documents = {
      "doc-small": place("doc-small", text(small), text(small_held), EVAL_FRACTION["doc-small"]),
      "doc-dev": place("doc-dev", text(dev_a), text(dev_b), EVAL_FRACTION["doc-dev"]),
      "doc-test": place("doc-test", [FILLER] * len(test_idx), text(test_idx),
                        EVAL_FRACTION["doc-test"]),
      "noisy-docstrings": noisy,
      "reference": list(corpus["reference"]),
      "python-code": list(corpus["python-code"]),
      "licenses": list(corpus["licenses"]),
      "doc-plus-dev": place(READ_AS["doc-plus-dev"], text(small + dev), text(plus_held),
                            EVAL_FRACTION["doc-plus-dev"]),
  }
  roles = {"doc-small": small, "doc-small held out": small_held, "dev-A": dev_a, "dev-B": dev_b,
           "doc-plus-dev held out": plus_held,
           "doc-test": test_idx, "dropped (their noisy twins kept)":
               [int(i) for i in train_idx if int(i) not in written]}
  return Pieces(documents, roles)


def check_leakage(pieces: Pieces, docstrings: Sequence[str]) -> dict[str, int]:
  """Refuses leaking pieces (a ``ValueError`` naming the first offence); returns what was checked.

  * doc-dev's and doc-test's held-out documents (and dev-A) share no document, nor with doc-small;
  * no dev or test document is a substring of any document of a training piece (both splits);
  * every noisy document is the twin of a docstring left out of every piece (none of doc-small's,
    doc-dev's or doc-test's documents has a noisy twin in training).
  """
  doc = pieces.documents
  dev = set(doc["doc-dev"])
  test = set(split("doc-test", doc["doc-test"], EVAL_FRACTION["doc-test"])[1])
  small = set(doc["doc-small"])
  for a, b, name in ((dev, test, "doc-dev and doc-test"), (dev, small, "doc-dev and doc-small"),
                     (test, small, "doc-test and doc-small")):
    if a & b:
      raise ValueError(f"{name} share {len(a & b)} document(s), e.g. {sorted(a & b)[0][:60]!r}")
  training = "\x00".join(d for s in TRAINING for d in doc[s])
  for name, docs in (("doc-dev", dev), ("doc-test", test)):
    for d in sorted(docs):
      if d in training:
        raise ValueError(f"a {name} document is a substring of a training piece: {d[:60]!r}")
  origin = twins(docstrings)   # made again: the check trusts nothing cut() computed
  kept = set(pieces.roles["dropped (their noisy twins kept)"])
  for d in doc["noisy-docstrings"]:
    if origin.get(d) not in kept:
      raise ValueError(f"noisy document {d[:60]!r} is the twin of docstring {origin.get(d)}, "
                       "which a piece holds (or it is no twin at all)")
  return {"dev documents": len(dev), "test documents": len(test),
          "training documents searched": sum(len(doc[s]) for s in TRAINING),
          "noisy documents traced": len(doc["noisy-docstrings"])}


def table(pieces: Pieces) -> list[dict]:
  """One row per piece: documents and tokens of its two splits."""
  rows = []
  for s in PIECES:
    train, held = split(READ_AS.get(s, s), pieces.documents[s], EVAL_FRACTION[s])
    rows.append({"source": s, "eval_fraction": EVAL_FRACTION[s], "train_documents": len(train),
                 "train_tokens": sum(map(tokens, train)), "eval_documents": len(held),
                 "eval_tokens": sum(map(tokens, held))})
  return rows


def format_table(rows: Sequence[dict]) -> str:
  head = "| source | eval_fraction | train docs | train tokens | held-out docs | held-out tokens |"
  lines = [head, "| --- | ---: | ---: | ---: | ---: | ---: |"]
  for r in rows:
    lines.append(f"| `{r['source']}` | {r['eval_fraction']} | {r['train_documents']:,} | "
                 f"{r['train_tokens']:,} | {r['eval_documents']:,} | {r['eval_tokens']:,} |")
  return "\n".join(lines)


def write(out_dir: str, corpus: Mapping[str, Sequence[str]] | None = None,
          target_tokens: int = TARGET_TOKENS) -> dict:
  """Cuts, checks and writes the pieces into ``out_dir`` (``<source>.jsonl`` and
  :data:`MANIFEST`); returns the manifest. Files are written atomically."""
  corpus = sc.stdlib_documents() if corpus is None else corpus
  pieces = cut(corpus, target_tokens)
  checked = check_leakage(pieces, corpus["docstrings"])
  os.makedirs(out_dir, exist_ok=True)
  files = {}
  for s in PIECES:
    text = "".join(json.dumps({"text": d}, ensure_ascii=False) + "\n" for d in pieces.documents[s])
    storage.atomic_write(os.path.join(out_dir, f"{s}.jsonl"), text, "run the prep again")
    files[s] = hashlib.sha256(text.encode("utf-8")).hexdigest()
  manifest = {"python": platform.python_version(), "pieces": table(pieces),
              "jsonl_sha256": files, "leakage_checked": checked,
              "roles": {r: len(v) for r, v in pieces.roles.items()}}
  storage.atomic_write(os.path.join(out_dir, MANIFEST), json.dumps(manifest, indent=1) + "\n",
                       "run the prep again")
  return manifest


def main(argv: Sequence[str] | None = None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--out", required=True, help="the folder the JSONL pieces go to")
  parser.add_argument("--target-tokens", type=int, default=TARGET_TOKENS,
                      help="doc-small's training tokens, at least (8000: the regime fallback)")
  args = parser.parse_args(argv)
  manifest = write(args.out, target_tokens=args.target_tokens)
  print(f"CPython {manifest['python']}; pieces in {os.path.abspath(args.out)}")
  print(format_table(manifest["pieces"]))
  print("roles (docstrings documents):", json.dumps(manifest["roles"]))
  print("leakage checked:", json.dumps(manifest["leakage_checked"]))


if __name__ == "__main__":
  main()
