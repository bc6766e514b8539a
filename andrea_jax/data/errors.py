"""The one exception class of the data pipeline."""


class DataError(ValueError):
  """Bad data, found before training starts: the message names the source, file and position.

  Raised for a missing or empty source, a source unknown to the run, a shard whose SHA-256 or size
  does not match the manifest, a token id outside the vocabulary, a tokenizer other than the one the
  data was prepared with, and unreadable input files. A ``ValueError``, so config validation that
  catches ``ValueError`` catches it too.
  """
