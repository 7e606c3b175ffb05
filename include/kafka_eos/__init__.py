"""kafka-eos: exactly-once Kafka -> Spark pipelines (the library; never imports airflow)."""

import logging

__version__ = "0.3.0"

# A library adds no handler of its own; this one keeps an unconfigured process (a Spark Python
# worker) from printing kafka-eos and librdkafka warnings to stderr. Entry points configure
# logging (kafka_eos.logs).
logging.getLogger("kafka_eos").addHandler(logging.NullHandler())
