"""The structure's limits (docs/architecture.md, "Structure"), measured from the source by
tests/structure.py: no import cycle, no import from a lower layer to a higher one, at most eight
places that switch on a sink's kind or commit scope."""

import structure  # tests/structure.py (tests/ is on the path, as for shared_servers)

#: The places that must choose (the spec's validation, lineage naming, a side run's places).
MAX_SWITCHES = 8


def test_the_import_graph_has_no_cycle():
    assert structure.cycles(structure.modules()) == []


def test_no_module_imports_from_a_higher_layer():
    assert structure.upward(structure.modules()) == []


def test_few_places_switch_on_a_sinks_kind_or_scope():
    found = structure.switches(structure.modules())
    assert len(found) <= MAX_SWITCHES, found


def test_every_module_is_in_a_layer():
    for name in structure.modules():
        structure.layer_of(name)  # raises KeyError naming the module


def test_the_measure_sees_a_switch_an_import_inside_a_function_and_a_cycle(tmp_path, monkeypatch):
    """The measure is not blind: a package of two modules importing each other (one inside a
    function) and comparing ``sink.kind`` is found out."""
    pkg = tmp_path / "kafka_eos"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "spec.py").write_text("from kafka_eos import batch\n")
    (pkg / "batch.py").write_text("def f(spec):\n    from kafka_eos import spec as s\n"
                                  "    return spec.sink.kind == 'kafka'\n")
    monkeypatch.setattr(structure, "PACKAGES", {"kafka_eos": pkg})
    monkeypatch.setattr(structure, "ROOT", tmp_path)
    found = structure.modules()
    assert found["kafka_eos.batch"].inner == {"kafka_eos.spec"}
    assert structure.cycles(found) == [["kafka_eos.batch", "kafka_eos.spec"]]
    assert structure.upward(found) == [("kafka_eos.spec", "kafka_eos.batch")]
    assert structure.switches(found) == ["kafka_eos/batch.py:3"]


def test_collecting_the_real_stacks_tests_marks_them_all_and_starts_no_jvm(tmp_path):
    """``-m "not integration"`` leaves out every test of tests/integration and tests/dags (their
    marker comes from tests/conftest.py), and collecting them runs no Java: a stub ``java`` on
    JAVA_HOME and PATH records any call."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    called = tmp_path / "java-called"
    java = tmp_path / "jdk" / "bin" / "java"
    java.parent.mkdir(parents=True)
    java.write_text(f"#!/bin/sh\necho \"$@\" >> {called}\nexit 1\n")
    java.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in ("SPARK_SUBMIT_OPTS", "PYTEST_XDIST_WORKER",
                                                            "PYTEST_ADDOPTS")}
    env.update(JAVA_HOME=str(java.parent.parent), PATH=f"{java.parent}{os.pathsep}{env['PATH']}")
    done = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                           "-m", "not integration", "tests/integration", "tests/dags"],
                          cwd=root, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 5, done.stdout[-2000:] + done.stderr[-2000:]  # 5: no test selected
    assert "deselected" in done.stdout.splitlines()[-1]
    assert not called.exists(), called.read_text()
