"""Reaching the Hugging Face Hub without hanging: cached files, resolved revisions, fast failure.

``huggingface_hub`` retries a file it cannot find in its cache: after a failed HEAD request it
tries again with a 60-second timeout and up to five back-offs, so a machine without network waits
tens of seconds to minutes before the error. A training launch should stop at once instead. So
:func:`hub_file`:

1. returns the file from the local cache when it is there (no network at all; pin a revision with
   ``@revision`` to get another one);
2. in offline mode (``HF_HUB_OFFLINE=1``, ``HF_DATASETS_OFFLINE=1`` or ``TRANSFORMERS_OFFLINE=1``)
   raises at once;
3. otherwise asks the Hub for the file's metadata once, without retries, with a timeout of
   ``HF_HUB_ETAG_TIMEOUT`` seconds (default :data:`TIMEOUT_S`), and raises at the first failure;
4. only then downloads the file (into the usual Hugging Face cache).

Every failure is a :class:`DataError` naming what was asked for and how to use a local file.
"""

from __future__ import annotations

import os

from andrea_jax.data.errors import DataError

TIMEOUT_S = 5.0   # seconds for one metadata request to the Hub (a few hundred bytes)
_OFFLINE_ENVS = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE")


def _errors():
  try:
    from huggingface_hub import errors
  except ImportError:   # huggingface_hub < 0.23 keeps them in utils
    from huggingface_hub import utils as errors
  return errors


def offline() -> bool:
  """Whether the Hub must not be contacted: one of ``HF_HUB_OFFLINE``, ``HF_DATASETS_OFFLINE``,
  ``TRANSFORMERS_OFFLINE`` is set to a true value (``1``, ``ON``, ``YES``, ``TRUE``), now or when
  ``huggingface_hub`` was imported."""
  if any(os.environ.get(k, "").upper() in ("1", "ON", "YES", "TRUE") for k in _OFFLINE_ENVS):
    return True
  try:
    from huggingface_hub import constants
  except ImportError:
    return False
  return bool(getattr(constants, "HF_HUB_OFFLINE", False))


def timeout_s() -> float:
  """``HF_HUB_ETAG_TIMEOUT`` when set (seconds), else :data:`TIMEOUT_S`."""
  try:
    return float(os.environ.get("HF_HUB_ETAG_TIMEOUT") or TIMEOUT_S)
  except ValueError:
    return TIMEOUT_S


def split_name(name: str) -> tuple[str, str | None]:
  """``"owner/repo@rev" -> ("owner/repo", "rev")``; no ``@`` gives revision ``None``."""
  repo, _, revision = name.partition("@")
  return repo, (revision or None)


class NotOnHub(DataError):
  """The repository exists but has no such file (the caller may try another file name)."""


def hub_file(repo: str, filename: str, *, revision: str | None = None,
             repo_type: str = "model", what: str = "file", local_hint: str = "") -> str:
  """The local path of ``filename`` of a Hub repository, downloaded once and cached.

  Args:
    repo: ``"owner/name"`` (or a canonical name such as ``"gpt2"``).
    filename: a file of the repository, e.g. ``"tokenizer.json"``.
    revision: a branch, tag or commit; ``None`` is the default branch.
    repo_type: ``"model"`` or ``"dataset"``.
    what: what the file is, for messages (``"tokenizer 'hf:gpt2'"``).
    local_hint: how to point at a local file instead, appended to every error.

  Raises:
    NotOnHub: the Hub answered that the file does not exist.
    DataError: offline and not cached, Hub unreachable, repository or revision unknown or gated.

  Example:
    >>> hub_file("gpt2", "tokenizer.json", what="tokenizer 'hf:gpt2'")   # doctest: +SKIP
    '/home/me/.cache/huggingface/hub/models--gpt2/snapshots/<commit>/tokenizer.json'
  """
  import huggingface_hub as hh

  errors = _errors()
  hint = f" {local_hint}" if local_hint else ""
  try:
    return hh.hf_hub_download(repo, filename, revision=revision, repo_type=repo_type,
                              local_files_only=True)
  except (errors.LocalEntryNotFoundError, FileNotFoundError, OSError, ValueError):
    pass   # not cached (or an unusable cache entry): ask the Hub below
  rev = f"@{revision}" if revision else ""
  if offline():
    raise DataError(f"{what}: {repo}{rev}/{filename} is not in the local Hugging Face cache and "
                    "offline mode is on (HF_HUB_OFFLINE / HF_DATASETS_OFFLINE); download it once "
                    f"with network, or use a local file.{hint}")
  try:
    url = hh.hf_hub_url(repo, filename, revision=revision, repo_type=repo_type)
    hh.get_hf_file_metadata(url, timeout=timeout_s())
  except errors.EntryNotFoundError as e:
    raise NotOnHub(f"{what}: the Hub has no file {filename!r} in {repo}{rev}") from e
  except errors.GatedRepoError as e:
    raise DataError(f"{what}: {repo} is gated: accept its conditions on huggingface.co and set "
                    f"HF_TOKEN ({type(e).__name__}).{hint}") from e
  except errors.RepositoryNotFoundError as e:
    raise DataError(f"{what}: no {repo_type} repository {repo!r} on the Hub (or it is private: "
                    f"set HF_TOKEN).{hint}") from e
  except errors.RevisionNotFoundError as e:
    raise DataError(f"{what}: {repo} has no revision {revision!r}.{hint}") from e
  except Exception as e:  # httpx/requests connection errors, timeouts, proxies: all unreachable
    raise DataError(f"{what}: cannot reach the Hugging Face Hub for {repo}{rev}/{filename} "
                    f"({type(e).__name__}: {e}); not in the local cache either.{hint}") from e
  try:
    return hh.hf_hub_download(repo, filename, revision=revision, repo_type=repo_type,
                              etag_timeout=timeout_s())
  except Exception as e:  # the network went away between the two calls
    raise DataError(f"{what}: downloading {repo}{rev}/{filename} failed "
                    f"({type(e).__name__}: {e}).{hint}") from e


def optional_hub_file(repo: str, filename: str, *, revision: str | None = None,
                      what: str = "file", local_hint: str = "") -> str | None:
  """The local path of a file a Hub repository may lack (``chat_template.jinja`` beside a
  ``tokenizer_config.json``), or ``None`` when it has none.

  The cache answers first: a cached copy, or the cache's record that the file does not exist.
  Offline, a file the cache knows nothing of counts as absent (the files a repository must have
  are fetched with :func:`hub_file`, which says what is missing). Online, one metadata request
  without retries, as :func:`hub_file`.

  Example:
    >>> optional_hub_file("gpt2", "chat_template.jinja") is None   # doctest: +SKIP
    True
  """
  import huggingface_hub as hh

  cached = hh.try_to_load_from_cache(repo, filename, revision=revision)
  if isinstance(cached, str):
    return cached
  if cached is not None or offline():   # known absent; or unknown and nothing may be asked
    return None
  try:
    return hub_file(repo, filename, revision=revision, what=what, local_hint=local_hint)
  except NotOnHub:
    return None


def dataset_revision(name: str, revision: str | None = None) -> str | None:
  """The commit a Hub dataset's ``revision`` (default branch when ``None``) points to now;
  ``None`` in offline mode. One request with the :func:`timeout_s` timeout, no retries.

  Raises:
    DataError: unknown dataset or revision, gated, or the Hub cannot be reached.
  """
  if offline():
    return None
  import huggingface_hub as hh

  errors = _errors()
  what = f"dataset {name!r}"
  try:
    return hh.HfApi().dataset_info(name, revision=revision, timeout=timeout_s()).sha
  except errors.GatedRepoError as e:
    raise DataError(f"{what} is gated: accept its conditions on huggingface.co and set "
                    "HF_TOKEN") from e
  except errors.RepositoryNotFoundError as e:
    raise DataError(f"{what}: no such dataset on the Hub (or it is private: set HF_TOKEN)") from e
  except errors.RevisionNotFoundError as e:
    raise DataError(f"{what} has no revision {revision!r}") from e
  except Exception as e:  # connection errors and timeouts
    raise DataError(f"{what}: cannot reach the Hugging Face Hub ({type(e).__name__}: {e}); if "
                    "the dataset is in the local cache set HF_HUB_OFFLINE=1 to read it from there, "
                    "or point the source at local files (data_files) or a save_to_disk "
                    "directory") from e
