"""The data pipeline: tokenizers, preparing sources into shards, the built-in corpus, the sampler.

* :mod:`tokenizers` -- ``load_tokenizer("bytes" | tokenizers .json | SentencePiece .model)``,
  ``train_bpe``.
* :mod:`readers`, :mod:`prepare_lib`, :mod:`manifest` (with :mod:`encode`, :mod:`commit`) --
  local files (JSONL, text, Parquet) to token shards and ``manifest.json``, each source swapped in
  all or nothing; command line ``python -m andrea_jax.data.prepare``.
* :mod:`hub` (with :mod:`hub_rows`, :mod:`chat`, :mod:`chat_templates`, :mod:`chat_files`,
  :mod:`chat_masks`, :mod:`hfhub`) -- Hugging Face datasets as sources (``HubSpec``),
  conversations rendered with chat templates, the loss on the assistant's turns only
  (``loss_on``); :mod:`andrea_sources` -- public datasets for ANDREA-120M's named sources.
* :mod:`shards` -- ``PreparedData.open``: memory-mapped shards, every check before training starts.
* :mod:`corpus` (with :mod:`styles`, :mod:`textgen`) -- the synthetic built-in corpus.
* :mod:`stdlib_corpus` (with :mod:`stdlib_text`, :mod:`corrupt`) -- the real-text built-in corpus,
  cut from the Python standard library (``python -m andrea_jax.data.stdlib_corpus`` prints it);
  :mod:`wordshare` and :mod:`bpb` measure text against it.
* :mod:`sampler` -- ``allocate``, ``MixtureSampler``, ``eval_batches``;
  :mod:`prefetch` -- ``Prefetcher``.
* :mod:`config` -- the ``data`` config section and ``open_training_data``.
"""

from andrea_jax.data.config import (CORPORA, corpus_vocabulary, data_config, default_cache_dir,
                                    open_training_data, validate_data_config)
from andrea_jax.data.corpus import builtin_documents, ensure_builtin, generate_builtin
from andrea_jax.data.errors import DataError
from andrea_jax.data.hub import HubSpec
from andrea_jax.data.prefetch import Prefetcher
from andrea_jax.data.prepare_lib import PrepareResult, prepare
from andrea_jax.data.readers import SourceSpec
from andrea_jax.data.sampler import (MixtureSampler, allocate, eval_batches, pack_rows,
                                     realised_shares)
from andrea_jax.data.shards import PreparedData
from andrea_jax.data.styles import NOISE_SOURCE
from andrea_jax.data.tokenizers import (ByteTokenizer, HFTokenizer, SentencePieceTokenizer,
                                        Tokenizer, load_tokenizer, train_bpe)

__all__ = [
    "CORPORA", "ByteTokenizer", "DataError", "HFTokenizer", "HubSpec", "MixtureSampler", "NOISE_SOURCE",
    "Prefetcher", "PrepareResult", "PreparedData", "SentencePieceTokenizer", "SourceSpec",
    "Tokenizer", "allocate", "builtin_documents", "corpus_vocabulary", "data_config", "default_cache_dir",
    "ensure_builtin", "eval_batches", "generate_builtin", "load_tokenizer", "open_training_data",
    "pack_rows", "prepare", "realised_shares", "train_bpe", "validate_data_config",
]
