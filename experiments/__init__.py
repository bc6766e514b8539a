"""Run configurations: each file's ``get_config()`` is what ``--config=experiments/<file>.py`` trains.

A package too, so that the tests and benchmarks (run from the repository's root) import them.
"""
