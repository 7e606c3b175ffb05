"""Where the project keeps local state: ``.local/`` beside the checkout (or $KAFKA_EOS_HOME)."""

from __future__ import annotations

import os
from pathlib import Path

#: The checkout this package was installed from (include/kafka_eos/ -> two levels up).
PROJECT_ROOT = Path(__file__).resolve().parents[2]


def local_dir() -> Path:
    """The ``.local`` state folder: broker data, jars, SQLite files, Airflow home."""
    return Path(os.environ.get("KAFKA_EOS_HOME", PROJECT_ROOT / ".local")).resolve()


def jars_dir(kind: str) -> Path:
    """Folder of resolved JVM jars: ``kafka`` (broker and tools) or ``spark`` (the connector)."""
    return local_dir() / "jars" / kind


def pipelines_dir() -> Path:
    """The folder of the pipeline specs: ``$KAFKA_EOS_PIPELINES_DIR``, else the bundled ones
    (include/pipelines/)."""
    return Path(os.environ.get("KAFKA_EOS_PIPELINES_DIR") or PROJECT_ROOT / "include" / "pipelines")
