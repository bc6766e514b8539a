"""Fault injection: kills, damaged and untrusted checkpoints, hostile configs, data and numbers.

``harness`` drives real training runs in subprocesses (bench/faults.py runs the long campaign with
it); the test modules keep to a few kills and small cases so that the suite stays fast.
"""
