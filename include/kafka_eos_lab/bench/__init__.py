"""Benchmarks: scripts that print figures and write JSON (``make bench-stream``). Not tests: they
measure, and say which targets were met; they never fail a build on a number."""
