"""The command line's parsing and error lines, without a broker."""

from __future__ import annotations

import pytest

from kafka_eos.cli import build_parser, python_error, remote_error
from kafka_eos.errors import KafkaEosError
from kafka_eos.settings import KafkaSettings


@pytest.mark.parametrize("argv", [
    ["--bootstrap", "b:9092", "-v", "run", "p", "--json"],
    ["run", "p", "--bootstrap", "b:9092", "-v", "--json"],
    ["-v", "run", "--json", "p", "--bootstrap", "b:9092"],
])
def test_global_flags_parse_before_or_after_the_command(argv):
    args = build_parser().parse_args(argv)
    assert (args.command, args.pipeline, args.bootstrap, args.verbose, args.json) == ("run", "p", "b:9092", True, True)


@pytest.mark.parametrize("argv", [
    ["--bootstrap", "b:9092", "txn", "hanging", "--topic", "a", "--topic", "b", "--older-than", "30"],
    ["txn", "hanging", "--topic", "a", "--bootstrap", "b:9092", "--topic", "b", "--older-than", "30"],
])
def test_txn_hanging_parses_with_flags_anywhere(argv):
    args = build_parser().parse_args(argv)
    assert (args.action, args.topic, args.older_than, args.bootstrap) == ("hanging", ["a", "b"], 30.0, "b:9092")


def test_txn_abort_needs_partition_and_start_offset_and_is_a_dry_run_without_yes(capsys):
    args = build_parser().parse_args(["txn", "abort", "--topic", "t", "--partition", "1", "--start-offset", "7"])
    assert (args.topic, args.partition, args.start_offset, args.yes) == ("t", 1, 7, False)
    with pytest.raises(SystemExit):
        build_parser().parse_args(["txn", "abort", "--topic", "t", "--partition", "1"])
    assert "--start-offset" in capsys.readouterr().err


def test_global_flags_default_when_absent():
    args = build_parser().parse_args(["checkpoint", "p"])
    assert (args.bootstrap, args.verbose, args.json) == (None, False, False)


def test_a_kafka_eos_error_raised_in_a_spark_task_is_found_in_the_driver_error():
    text = ("An error occurred while calling o97.collectToPython.\n: org.apache.spark.SparkException: Job aborted "
            "due to stage failure: ... org.apache.spark.api.python.PythonException: Traceback (most recent call "
            "last):\n  File \"x.py\", line 1, in f\nkafka_eos.errors.DeadLetterWithoutTopic: orders-1 offset 42: "
            "dead letter (bad amount) but p.yaml has no sink.dlq_topic\n\tat org.apache.spark...")
    assert remote_error(RuntimeError(text)) == "orders-1 offset 42: dead letter (bad amount) but p.yaml has no sink.dlq_topic"
    assert remote_error(RuntimeError("something else")) is None


def test_a_python_error_in_a_spark_task_is_its_exception_line_not_sparks_first():
    text = ("An exception was thrown from the Python worker. Please see the stack trace below.\n"
            "Traceback (most recent call last):\n  File \"/t/raiser.py\", line 9, in _check\n"
            "    raise ValueError(\"boom on record \" + s[:40])\nValueError: boom on record orders-2 5\n"
            "\n\tat org.apache.spark.api.python.BasePythonRunner...")
    assert python_error(RuntimeError(text)) == "ValueError: boom on record orders-2 5"
    chained = text.replace("Traceback", "Traceback (most recent call last):\n  File \"a\"\nKeyError: 'x'\n\n"
                                        "During handling of the above exception, another exception occurred:\n\n"
                                        "Traceback", 1)
    assert python_error(RuntimeError(chained)) == "ValueError: boom on record orders-2 5"  # the last one
    assert python_error(RuntimeError("no traceback here")) is None


def test_pipelines_names_a_folder_of_specs_that_is_not_there(tmp_path, monkeypatch, capsys):
    from kafka_eos.cli import main

    monkeypatch.setenv("KAFKA_EOS_PIPELINES_DIR", str(tmp_path / "nope"))
    assert main(["--bootstrap", "127.0.0.1:9", "pipelines"]) == 1
    assert capsys.readouterr().err.startswith(f"kafka-eos: {tmp_path / 'nope'}: no such folder of pipeline specs")


def test_connect_timeout_comes_from_the_environment():
    env = {"KAFKA_EOS_CONNECT_TIMEOUT_S": "2.5"}
    assert KafkaSettings.from_environ(env, "b:9092").connect_timeout_s == 2.5
    assert KafkaSettings.from_environ({}, "b:9092").connect_timeout_s == 10.0
    with pytest.raises(KafkaEosError, match="KAFKA_EOS_CONNECT_TIMEOUT_S: 'soon' is not a positive number"):
        KafkaSettings.from_environ({"KAFKA_EOS_CONNECT_TIMEOUT_S": "soon"}, "b:9092")


def test_client_logs_go_to_python_logging_not_stderr():
    assert KafkaSettings("b:9092").client_config()["logger"].name == "kafka_eos.librdkafka"


def test_clients_reconnect_after_20_ms_unless_the_settings_say_otherwise():
    # librdkafka's default (100 ms) costs each new client 50 ms before its first request.
    assert KafkaSettings("b:9092").client_config()["reconnect.backoff.ms"] == 20
    assert KafkaSettings("b:9092", extra={"reconnect.backoff.ms": "250"}).client_config()["reconnect.backoff.ms"] == "250"


def test_secrets_stay_out_of_reprs():
    from kafka_eos.spec import parse_spec

    settings = KafkaSettings("b:9092", extra={"sasl.username": "u", "sasl.password": "s3cret"})
    assert "s3cret" not in repr(settings) and "b:9092" in repr(settings)
    spec = parse_spec({"name": "p", "source": {"topics": ["t"]}, "transform": "identity",
                       "sink": {"kind": "sql", "table": "t", "url": "postgresql://u:${PW}@db/x"}},
                      "p.yaml", {"PW": "s3cret"})
    assert spec.sink.url == "postgresql://u:s3cret@db/x"
    assert "s3cret" not in repr(spec)


@pytest.mark.parametrize("argv, flag, value", [
    (["run", "p", "--max-records", "-1"], "--max-records", "'-1' is not a positive integer"),
    (["run", "p", "--max-records", "0"], "--max-records", "'0' is not a positive integer"),
    (["stream", "p", "--interval", "-2"], "--interval", "'-2' is not a positive number"),
    (["stream", "p", "--interval", "nan"], "--interval", "'nan' is not a positive number"),
    (["stream", "p", "--max-batches", "0"], "--max-batches", "'0' is not a positive integer"),
    (["txn", "hanging", "--older-than", "-5"], "--older-than", "'-5' is not a number of 0 or more"),
    (["txn", "abort", "--topic", "t", "--partition", "-1", "--start-offset", "0"], "--partition",
     "'-1' is not an integer of 0 or more"),
])
def test_counts_and_durations_out_of_range_are_refused_naming_the_flag(argv, flag, value, capsys):
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(argv)
    assert exited.value.code == 2
    (last,) = [line for line in capsys.readouterr().err.splitlines() if line.startswith("kafka-eos")][-1:]
    assert f"argument {flag}" in last and value in last


def test_counts_and_durations_in_range_are_taken():
    args = build_parser().parse_args(["stream", "p", "--interval", "0.5", "--max-records", "10", "--max-batches", "1"])
    assert (args.interval, args.max_records, args.max_batches) == (0.5, 10, 1)


def test_a_task_error_is_the_transforms_only_where_its_module_is_on_the_stack():
    from types import SimpleNamespace

    from kafka_eos.batch import transform_raised
    from kafka_eos.errors import TransformFailed

    def task_error(*files: str) -> RuntimeError:
        frames = "".join(f'  File "{f}", line 3, in f\n    x()\n' for f in files)
        return RuntimeError("Job aborted due to stage failure: org.apache.spark.api.python.PythonException: "
                            f"Traceback (most recent call last):\n{frames}KeyError: 'amount'\n\tat org.apache...")

    spec = SimpleNamespace(path="p.yaml", transform="shop.transforms.orders:enrich")
    worker = "/venv/lib/python3.11/site-packages/pyspark/python/lib/pyspark.zip/pyspark/worker.py"
    # The transform's module on the stack, wherever the workers import it from: a folder, a zip of --py-files.
    for where in ("/srv/app/shop/transforms/orders.py", "/tmp/spark-1/userFiles/deps.zip/shop/transforms/orders.py"):
        failed = transform_raised(spec, task_error(worker, where, "/usr/lib/python3.11/json/decoder.py"))
        assert isinstance(failed, TransformFailed)
        assert str(failed) == "p.yaml: transform shop.transforms.orders:enrich raised in a Spark task: KeyError: 'amount'"
    # kafka-eos's own task code, or a module of the same name elsewhere: not the transform's.
    assert transform_raised(spec, task_error(worker, "/venv/site-packages/kafka_eos/sinks/batches.py")) is None
    assert transform_raised(spec, task_error(worker, "/srv/app/other/orders.py")) is None
    assert transform_raised(spec, RuntimeError("no traceback")) is None
    # A one-word module named as one of kafka-eos's or PySpark's files: those files are not it.
    txn = SimpleNamespace(path="p.yaml", transform="txn:f")
    assert transform_raised(txn, task_error(worker, "/venv/lib/python3.11/site-packages/kafka_eos/txn.py")) is None
    assert transform_raised(txn, task_error(worker, "/srv/app/txn.py")) is not None
    assert transform_raised(SimpleNamespace(path="p.yaml", transform="identity"), task_error(worker)) is None


def test_a_reader_that_goes_ends_the_output_and_the_command_keeps_its_exit_code():
    """What `kafka-eos txn hanging | head -1` meets: the reader goes while the command still writes."""
    import subprocess
    import sys

    script = ("import sys\nfrom kafka_eos.console import ReaderMayGo\n"
              "sys.stdout, sys.stderr = ReaderMayGo(sys.stdout), ReaderMayGo(sys.stderr)\n"
              "for i in range(20000):\n    print('a row of the table', i)\n    print('a step', i, file=sys.stderr)\n"
              "sys.exit(3)\n")
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    child.stdout.read(100)
    child.stdout.close()  # gone after its first lines: many writes (and flushes) of stdout meet a closed pipe
    child.stderr.read(100)
    child.stderr.close()
    assert child.wait(timeout=60) == 3
