"""The embedded default: the services kafka-eos starts on 127.0.0.1 for the demo, the commands
(`kafka-eos kafka|spark|airflow start`) and the tests — a Kafka broker or a 3-node cluster from
the Apache Kafka jars (:mod:`.kafka`), a Spark standalone cluster (:mod:`.spark`), an Airflow
deployment (:mod:`.airflow`), a throwaway PostgreSQL (:mod:`.postgres`), and how their process
groups are stopped (:mod:`.process_groups`). Nothing in a pipeline's run path imports it.
"""
