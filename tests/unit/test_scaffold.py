"""kafka-eos new: the files of a new pipeline; the spec they make parses, names its transform,
and nothing that exists is overwritten."""

from __future__ import annotations

import pytest
import yaml

from kafka_eos.cli import main
from kafka_eos.errors import SpecError
from kafka_eos.scaffold import new_pipeline, write
from kafka_eos.spec import parse_spec


def test_new_writes_a_spec_a_transform_and_its_test(tmp_path, capsys):
    assert main(["new", "clicks", "--dir", str(tmp_path), "--source", "web.clicks", "--commit", "per_partition"]) == 0
    written = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file())
    assert written == ["pipelines/clicks.yaml", "tests/test_clicks.py", "transforms/__init__.py", "transforms/clicks.py"]
    spec = parse_spec(yaml.safe_load((tmp_path / "pipelines" / "clicks.yaml").read_text()), "clicks.yaml")
    assert spec.source.topics == ("web.clicks",) and spec.transform == "transforms.clicks:transform"
    assert (spec.sink.topic, spec.sink.dlq_topic, spec.sink.backfill_topic, spec.sink.commit) == (
        "clicks.out", "clicks.dlq", "clicks.backfill", "per_partition")
    assert "def transform(df: DataFrame) -> DataFrame:" in (tmp_path / "transforms" / "clicks.py").read_text()
    assert "from transforms.clicks import transform" in (tmp_path / "tests" / "test_clicks.py").read_text()
    assert "kafka-eos topics create" in capsys.readouterr().out


def test_a_second_pipeline_shares_the_package_and_nothing_is_overwritten(tmp_path):
    write(tmp_path, new_pipeline("a"))
    init = tmp_path / "transforms" / "__init__.py"
    init.write_text("# mine\n")
    write(tmp_path, new_pipeline("b"))
    assert init.read_text() == "# mine\n" and (tmp_path / "transforms" / "b.py").is_file()
    (tmp_path / "transforms" / "c.py").write_text("# mine\n")
    with pytest.raises(SpecError, match=r"transforms/c\.py: exists already; nothing was written"):
        write(tmp_path, new_pipeline("c"))
    assert not (tmp_path / "pipelines" / "c.yaml").exists()


@pytest.mark.parametrize("name, package, message", [
    ("Clicks", "transforms", "'Clicks': a pipeline name is lower case"),
    ("1clicks", "transforms", "'1clicks': a pipeline name is lower case"),
    ("clicks", "my-pkg", "--package 'my-pkg': a package name"),
])
def test_unusable_names_are_refused(name, package, message):
    with pytest.raises(SpecError, match=message):
        new_pipeline(name, package=package)


def test_a_transform_beside_the_specs_imports_without_being_installed(tmp_path):
    write(tmp_path, new_pipeline("beside", package="beside_pkg"))
    (tmp_path / "beside_pkg" / "beside.py").write_text("def transform(df):\n    return df\n")
    spec = parse_spec(yaml.safe_load((tmp_path / "pipelines" / "beside.yaml").read_text()),
                      str(tmp_path / "pipelines" / "beside.yaml"))
    assert spec.load_transform()("df") == "df"


def test_new_with_a_registry_format_writes_a_struct_transform_that_runs(tmp_path, spark, monkeypatch):
    import importlib

    assert main(["new", "orders", "--dir", str(tmp_path), "--format", "avro", "--package", "avro_scaffold"]) == 0
    spec = parse_spec(yaml.safe_load((tmp_path / "pipelines" / "orders.yaml").read_text()),
                      str(tmp_path / "pipelines" / "orders.yaml"))
    assert (spec.source.format, spec.source.key_format, spec.sink.format) == ("avro", "string", "avro")
    monkeypatch.syspath_prepend(str(tmp_path))
    transform = importlib.import_module("avro_scaffold.orders").transform
    df = spark.createDataFrame(
        [("c-1", ("o-1", 12.5), "in", 0, 0), ("c-2", None, "in", 0, 1)],
        "key string, value struct<order_id: string, amount: double>, topic string, partition int, offset long")
    rows = sorted(transform(df).collect(), key=lambda r: r.offset)
    assert [r.dlq_reason for r in rows] == [None, "no value (a tombstone)"]
    assert rows[0].value.asDict() == {"order_id": "o-1", "amount": 12.5} and rows[0].key == "c-1"
    generated = (tmp_path / "tests" / "test_orders.py").read_text()
    assert "value struct<order_id: string, amount: double>" in generated
