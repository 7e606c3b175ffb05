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
