"""Hung transactions: find partitions whose last stable offset is pinned by an open
transaction (:mod:`.detect`), name the transaction behind it (:mod:`.attribute`), and abort
it on an operator's explicit request (:mod:`.abort`).

An open transaction pins the LSO of every partition it wrote to; read_committed readers,
kafka-eos's own pipelines included, stop there, while lag measured to the high watermark
blames the consumer. See docs/operations.md, "Hung transactions".
"""
