"""Where kafka-eos keeps local state and finds pipeline specs.

In a checkout (an editable install): ``.local/`` beside it and the bundled example specs in
include/pipelines/. Installed from a wheel: ``~/.kafka-eos`` and ``./pipelines``. The environment
overrides both (``KAFKA_EOS_HOME``, ``KAFKA_EOS_PIPELINES_DIR``).
"""

from __future__ import annotations

import os
from pathlib import Path

#: The checkout this package is imported from (include/kafka_eos/ -> two levels up); only
#: meaningful where :data:`IN_CHECKOUT`.
PROJECT_ROOT = Path(__file__).resolve().parents[2]
#: Imported from a checkout (not from an installed wheel's site-packages).
IN_CHECKOUT = (PROJECT_ROOT / "pyproject.toml").is_file() and (PROJECT_ROOT / "include" / "kafka_eos").is_dir()


def local_dir() -> Path:
    """The state folder: broker data, jars, SQLite files, Airflow home (``$KAFKA_EOS_HOME``; else
    ``.local`` in a checkout, ``~/.kafka-eos`` for an installed package)."""
    default = PROJECT_ROOT / ".local" if IN_CHECKOUT else Path.home() / ".kafka-eos"
    return Path(os.environ.get("KAFKA_EOS_HOME") or default).resolve()


def jars_dir(kind: str) -> Path:
    """Folder of resolved JVM jars: ``kafka`` (broker and tools) or ``spark`` (the connector)."""
    return local_dir() / "jars" / kind


def pipelines_dir() -> Path:
    """The folder of the pipeline specs: ``$KAFKA_EOS_PIPELINES_DIR``; else the bundled examples
    (include/pipelines/) in a checkout, ``./pipelines`` (where ``kafka-eos new`` writes) otherwise."""
    default = PROJECT_ROOT / "include" / "pipelines" if IN_CHECKOUT else Path("pipelines")
    return Path(os.environ.get("KAFKA_EOS_PIPELINES_DIR") or default)


def spark_app(name: str = "run_pipeline") -> Path:
    """The file of a spark-submit entry point (``spark_apps/<name>.py``), in a checkout or installed."""
    import importlib.util

    found = importlib.util.find_spec(f"spark_apps.{name}")
    if found is None or found.origin is None:
        raise FileNotFoundError(f"spark_apps.{name}: no such Spark application in the installed kafka-eos")
    return Path(found.origin)


def write_private(path: Path, data: str | bytes) -> None:
    """Write ``data`` to ``path`` (replacing it), readable by its owner only from the moment the
    file exists: passwords, keys and client settings."""
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(data.encode() if isinstance(data, str) else data)
