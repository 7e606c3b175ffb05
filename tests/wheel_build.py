"""The wheel a user installs, built from this checkout's files in a folder of its own: the
checkout's build/ may hold files of an earlier build (setuptools reuses it), and two tests
building at once must not share it."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: What the distribution is built from (pyproject.toml's package-dir, its metadata files).
SOURCES = ("pyproject.toml", "LICENSE", "README.md", "include/kafka_eos", "plugins/kafka_eos_airflow", "spark_apps")


def build_wheel(work: Path) -> Path:
    """``work/dist/kafka_eos-<version>-py3-none-any.whl``, built from a clean copy under ``work/src``."""
    src = work / "src"
    for name in SOURCES:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            (src / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(ROOT / name, src / name)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(work / "dist"), str(src)],
                   check=True, timeout=600)
    (wheel,) = (work / "dist").glob("kafka_eos-*.whl")
    return wheel
