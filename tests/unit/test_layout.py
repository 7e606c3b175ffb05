"""The layout (docs/architecture.md): imports flow dags -> plugins -> include <- spark_apps; include never imports airflow."""

from __future__ import annotations

import ast
from pathlib import Path

from structure import parse

ROOT = Path(__file__).resolve().parents[2]


def _imports(folder: Path) -> list[tuple[Path, str]]:
    found = []
    for path in folder.rglob("*.py"):
        for node in ast.walk(parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                found += [(path, a.name) for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                found.append((path, node.module))
    return found


def test_library_never_imports_airflow_dags_or_plugins():
    # The library; not the lab (include/kafka_eos_lab), which drives Airflow deployments and plugs
    # a test auth manager into one.
    bad = [(str(p.relative_to(ROOT)), m) for p, m in _imports(ROOT / "include" / "kafka_eos")
           if m.split(".")[0] in ("airflow", "dags", "plugins", "kafka_eos_airflow")]
    assert bad == []


def test_spark_apps_import_only_the_library():
    bad = [(str(p.relative_to(ROOT)), m) for p, m in _imports(ROOT / "spark_apps")
           if m.split(".")[0] in ("airflow", "dags", "plugins", "kafka_eos_airflow")]
    assert bad == []


#: The one writer that uses Spark's own (at-least-once) Kafka sink on purpose: ``make bench``'s
#: baseline, what kafka-eos is measured against. It never writes a pipeline's results.
AT_LEAST_ONCE_BASELINE = ROOT / "include" / "kafka_eos_lab" / "bench" / "baseline_app.py"


def test_at_least_once_spark_kafka_sink_is_never_used():
    for path in list((ROOT / "include").rglob("*.py")) + list((ROOT / "spark_apps").rglob("*.py")):
        if path == AT_LEAST_ONCE_BASELINE:
            continue
        text = path.read_text().replace(" ", "")
        assert '.write.format("kafka")' not in text and ".writeStream.format(\"kafka\")" not in text, path


def _tracked_text_files() -> list[Path]:
    import subprocess

    names = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return [ROOT / n for n in names.splitlines()
            if (ROOT / n).is_file() and (ROOT / n).suffix in (".py", ".md", ".toml", ".yaml", ".yml", ".txt", "")]


def test_the_repository_documents_itself():
    """Nothing points readers at files outside the repository; every docs/ page named exists."""
    import re

    outside = re.compile(r"\.\./shared|DESIGN\.md")
    named = re.compile(r"docs/[a-z_-]+\.md")
    bad, missing = [], set()
    for path in _tracked_text_files():
        text = path.read_text(errors="replace")
        if outside.search(text):
            bad.append(str(path.relative_to(ROOT)))
        missing |= {m for m in named.findall(text) if not (ROOT / m).is_file()}
    assert bad == [] and missing == set()


def test_no_two_test_modules_share_a_name():
    # pytest imports test modules by their basename (rootdir conftest, prepend import mode): a
    # second module of the same name stops the whole suite at collection.
    names: dict[str, list[str]] = {}
    for path in (ROOT / "tests").rglob("test_*.py"):
        names.setdefault(path.name, []).append(str(path.relative_to(ROOT)))
    assert {name: paths for name, paths in names.items() if len(paths) > 1} == {}
