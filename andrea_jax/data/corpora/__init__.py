"""The built-in corpora: data generated on this machine, no download; a plug-in of the data
pipeline (``data.corpus``), imported only when a run asks for one.

* :mod:`.stdlib` (with :mod:`.stdlib_text`, :mod:`.corrupt`) -- real text cut from the Python
  standard library that runs it (``python -m andrea_jax.data.corpora.stdlib`` prints it), and
  :mod:`.wordshare`, the share of sampled words that are words of the corpus;
* :mod:`.synthetic` (with :mod:`.styles`, :mod:`.textgen`) -- sixteen generated sources under
  ANDREA's source names.
"""
