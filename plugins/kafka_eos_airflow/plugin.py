"""Deprecated: this module moved to :mod:`kafka_eos_airflow.plugins.plugin` (the provider's layout); the old path goes in the
next release."""

from kafka_eos_airflow._moved import moved

__getattr__ = moved(__name__, "kafka_eos_airflow.plugins.plugin")
