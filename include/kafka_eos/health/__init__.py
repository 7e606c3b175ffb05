"""Hung transactions: find partitions whose last stable offset is pinned by an open
transaction (:mod:`.detect`), name the transaction behind it (:mod:`.attribute`), and abort
it on an operator's explicit request (:mod:`.abort`).

An open transaction pins the LSO of every partition it wrote to; read_committed readers,
kafka-eos's own pipelines included, stop there, while lag measured to the high watermark
blames the consumer. See docs/operations.md, "Hung transactions".

This module imports nothing: DAG files read the default below at parse time.
"""

#: Default threshold: a transaction open longer than this is reported. kafka-eos's own
#: transactions last at most their timeout (sink.transaction_timeout_s, 300 s by default); a
#: minute more keeps a pipeline's own slow commit from being reported as hung.
DEFAULT_OLDER_THAN_S = 360.0
#: How much longer than a watched pipeline's own ``transaction_timeout_s`` a transaction must be
#: open before the watchdog reports it.
WATCH_MARGIN_S = 60.0


def spec_topics(spec) -> list[str]:
    """Every topic a pipeline reads or writes, as the watchdog watches them: sources, sink, dead
    letters, backfills, its manifest."""
    topics = [*spec.source.topics, spec.sink.topic, spec.sink.dlq_topic, spec.sink.backfill_topic,
              spec.manifest_topic]
    return list(dict.fromkeys(t for t in topics if t))


def watch_threshold_s(transaction_timeouts_s) -> float:
    """The watchdog's threshold for pipelines with these ``sink.transaction_timeout_s``: the
    longest of them plus :data:`WATCH_MARGIN_S`, and never under :data:`DEFAULT_OLDER_THAN_S`
    (a pipeline that allows a 900 s transaction is not reported at 360 s)."""
    return max([DEFAULT_OLDER_THAN_S, *(float(t) + WATCH_MARGIN_S for t in transaction_timeouts_s)])


def abort_command(topic: str, partition: int, start_offset: int) -> str:
    """The command that aborts the transaction starting at ``start_offset`` (a dry run first)."""
    return f"kafka-eos txn abort --topic {topic} --partition {partition} --start-offset {start_offset}"
