"""The product's tests (``make test``; ``make test-fast`` leaves out those marked slow)."""
