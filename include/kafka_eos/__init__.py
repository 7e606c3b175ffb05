"""kafka-eos: exactly-once Kafka -> Spark pipelines (the library; never imports airflow)."""

__version__ = "0.1.0"
