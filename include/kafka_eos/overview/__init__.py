"""The operator's view of every pipeline at once: what the operator page and its JSON API show
(:mod:`kafka_eos.overview.snapshot`). It only reads: it never commits, aborts or produces."""
