"""The data pipeline: sources to token shards, shards to batches; corpora and datasets plug in.

One pipeline, in order:

* :mod:`tokenizers` -- ``load_tokenizer("bytes" | tokenizers .json | SentencePiece .model |
  hf:<repo>)``, ``train_bpe``;
* :mod:`formats` -- data formats by name (``data.files.<source>.format``: ``jsonl``, ``text``,
  ``parquet``, ``hf`` or ``"package.module:factory"``), each source's section made from its
  format's fields; :mod:`readers` -- the built-in file formats (JSONL, text, Parquet);
* :mod:`prepare_lib` with :mod:`encode`, :mod:`manifest` and :mod:`commit` -- each source
  tokenized into shards and ``manifest.json``, swapped in all or nothing (command line:
  ``python -m andrea_jax.data.prepare``);
* :mod:`shards` -- ``PreparedData.open``: memory-mapped shards, every check before training starts;
* :mod:`sampler` -- ``allocate``, ``MixtureSampler``, ``eval_batches``; :mod:`prefetch` --
  ``Prefetcher``; :mod:`bpb` -- bits per byte of held-out text;
* :mod:`config` -- the ``data`` config section, checked once into a :class:`DataSpec`
  (``data_spec``); :mod:`pipeline` -- ``open_training_data(spec)``, which prepares what is missing
  and opens it with every check.

Two plug-ins, each imported only when a run asks for it:

* :mod:`andrea_jax.data.corpora` -- the built-in corpora (``data.corpus``): ``stdlib`` (real text
  from the Python standard library) and ``synthetic``;
* :mod:`andrea_jax.data.hub` -- Hugging Face datasets and chat data (``format = "hf"``): chat
  templates, the loss on the assistant's turns (``loss_on``), ANDREA-120M's public sources.
"""

from andrea_jax.data.config import (CORPORA, DataSpec, data_config, data_spec, default_cache_dir,
                                    set_source, source_files, validate_data_config)
from andrea_jax.data.errors import DataError
from andrea_jax.data.formats import Source
from andrea_jax.data.hub.spec import HubSpec
from andrea_jax.data.pipeline import corpus_vocabulary, open_training_data
from andrea_jax.data.prefetch import Prefetcher
from andrea_jax.data.prepare_lib import PrepareResult, prepare
from andrea_jax.data.readers import SourceSpec
from andrea_jax.data.sampler import (MixtureSampler, allocate, eval_batches, pack_rows,
                                     realised_shares)
from andrea_jax.data.shards import PreparedData
from andrea_jax.data.tokenizers import (ByteTokenizer, HFTokenizer, SentencePieceTokenizer,
                                        Tokenizer, load_tokenizer, train_bpe)

__all__ = [
    "CORPORA", "ByteTokenizer", "DataError", "DataSpec", "HFTokenizer", "HubSpec",
    "MixtureSampler", "Prefetcher", "PrepareResult", "PreparedData", "SentencePieceTokenizer",
    "Source", "SourceSpec", "Tokenizer", "allocate", "corpus_vocabulary", "data_config",
    "data_spec", "default_cache_dir", "eval_batches", "load_tokenizer", "open_training_data",
    "pack_rows", "prepare", "realised_shares", "set_source", "source_files", "train_bpe",
    "validate_data_config",
]
