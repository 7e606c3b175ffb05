"""The fault matrix: pipelines run on the local three-node cluster while faults hit them — brokers
killed, terminated or stopped (the partition leader, the transaction coordinator), the driver or an
executor's Python worker killed at each step of the commit, a zombie attempt resuming after a newer
one committed, a producer stalled past its transaction timeout — and checkers count, per scenario,
what exactly-once forbids: records lost or duplicated, aborted input visible, output left in open
transactions, checkpoints that disagree with the output, SQL and Kafka checkpoints apart.

``python -m kafka_eos_lab.chaos`` (``make chaos``) prints the table and exits 1 on any anomaly.
"""
