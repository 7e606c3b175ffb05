"""Sinks: where a run's results go, each committing through one transaction protocol."""
