"""The distribution: the provider's description is what Airflow's ProvidersManager accepts, names
modules and classes that exist, and is registered as the package's entry point, as its plugin is."""

from __future__ import annotations

import importlib
import json
from importlib import metadata
from pathlib import Path

import jsonschema

from kafka_eos_airflow import get_provider_info

ROOT = Path(__file__).resolve().parents[2]


def test_the_provider_info_is_valid_for_airflow_and_names_what_exists():
    import airflow

    info = get_provider_info()
    schema = json.loads((Path(airflow.__file__).parent / "provider_info.schema.json").read_text())
    jsonschema.validate(info, schema)
    assert info["package-name"] == "kafka-eos" and info["versions"] == [metadata.version("kafka-eos")]
    for kind in ("operators", "sensors", "hooks", "triggers"):
        for entry in info[kind]:
            for module in entry["python-modules"]:
                importlib.import_module(module)
    for dotted in info["notifications"] + [p["plugin-class"] for p in info["plugins"]]:
        module, _, name = dotted.rpartition(".")
        assert hasattr(importlib.import_module(module), name), dotted


def test_the_provider_is_the_packages_entry_point():
    (entry,) = [e for e in metadata.entry_points(group="apache_airflow_provider") if e.dist.name == "kafka-eos"]
    assert entry.load() is get_provider_info
    (plugin,) = [e for e in metadata.entry_points(group="airflow.plugins") if e.dist.name == "kafka-eos"]
    assert plugin.load().name == "kafka_eos"
    scripts = {e.name: e.value for e in metadata.entry_points(group="console_scripts") if e.dist.name == "kafka-eos"}
    assert scripts == {"kafka-eos": "kafka_eos.cli:main"}


def test_the_old_import_paths_work_for_one_release_with_a_deprecation_warning():
    """The provider took Airflow's layout (hooks/, operators/, ...): every name of the old
    modules is still found there, with a warning naming where it lives now."""
    import warnings

    from airflow.exceptions import AirflowProviderDeprecationWarning

    moved = {"hooks": ("KafkaEosHook", "kafka_eos_airflow.hooks.kafka"),
             "operators": ("KafkaEosPlanOperator", "kafka_eos_airflow.operators.pipeline"),
             "sensors": ("HungTransactionSensor", "kafka_eos_airflow.sensors.kafka"),
             "triggers": ("CommittedDataTrigger", "kafka_eos_airflow.triggers.kafka"),
             "assets": ("sink_alias", "kafka_eos_airflow.assets.kafka"),
             "checks": ("FreshnessCheckOperator", "kafka_eos_airflow.operators.checks"),
             "runbook": ("AbortTransactionOperator", "kafka_eos_airflow.operators.runbook"),
             "stream": ("KafkaEosStreamOperator", "kafka_eos_airflow.operators.stream"),
             "notifiers": ("KafkaEosWebhookNotifier", "kafka_eos_airflow.notifications.alerts"),
             "operator_page": ("render", "kafka_eos_airflow.plugins.operator_page"),
             "plugin": ("KafkaEosPlugin", "kafka_eos_airflow.plugins.plugin")}
    for old, (name, new) in moved.items():
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            value = getattr(importlib.import_module(f"kafka_eos_airflow.{old}"), name)
        assert value is getattr(importlib.import_module(new), name)
        assert [(w.category, str(w.message).split(":")[0]) for w in caught] == [
            (AirflowProviderDeprecationWarning, f"kafka_eos_airflow.{old}.{name} is deprecated")], old
