"""Working on a pipeline's past: positions given by a person (a timestamp or explicit offsets,
checked against the log), and moving a pipeline's checkpoint to them (a reset, fenced and
audited). Replays and backfills of a bounded range build on these.
"""
