"""The soak (``make soak``): hours of scheduled, streamed and side runs under a real scheduler, with
faults thrown at random from a seed and an operator acting through Airflow's REST API; then an
audit of every output. See docs/soak.md."""
