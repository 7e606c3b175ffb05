"""Cheaper starts for short-lived local Spark drivers: JVM flags and a class-data archive.

``kafka-eos demo`` starts four small spark-submit jobs through Airflow, and the test suite dozens
(spark-submit from DAG runs, ``kafka-eos run`` and stream processes, the in-process SparkSession of
each worker). Most of a small driver's CPU goes to loading and verifying some ten thousand classes
and compiling them. Two JVM settings cut it, and neither changes what Spark does:

- the JIT's first tier only and the serial collector (a 10-record ``kafka-eos run`` 24.7 s ->
  19.7 s);
- a dynamic class-data-sharing archive (JDK AppCDS, ``-XX:SharedArchiveFile``): the classes a
  driver loads, dumped once by a probe job and mapped by every later driver instead of being
  parsed and verified again (measured on 2 cores: a small spark-submit job 15.7-18.2 -> 10.0-11.7
  CPU seconds).

Both suit short jobs on a developer's machine, not a long production job (whose JIT should reach
its last tier): they go into ``SPARK_SUBMIT_OPTS`` of the demo's and the tests' processes only.
The archive is made once per JDK, pyspark and connector jars (its name holds a digest of them)
under ``.local/spark-cds/`` (about 150 MB) and reused by every later demo and test session; a
driver whose class path differs from the probe's (another ``SPARK_CONF_DIR``, another virtualenv)
silently starts without it. Only ``spark-class`` reads ``SPARK_SUBMIT_OPTS``: brokers are not
affected.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from kafka_eos.paths import local_dir
from kafka_eos.spark_io import connector_jars

#: JIT's first tier and the serial collector: a short-lived JVM starts about 20% sooner.
BASE_OPTS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
#: ``spark-class`` first runs a small JVM (Spark's launcher) that builds the real command; it reads
#: its settings here. With :data:`BASE_OPTS`: 0.22 CPU seconds rather than 0.31 (median of eight).
LAUNCHER_OPTS_ENV = "SPARK_LAUNCHER_OPTS"
#: A probe job on 2 busy cores takes well under a minute; dumping the archive adds ~10 s.
PROBE_TIMEOUT_S = 300

#: What a test's Spark driver typically does: Spark SQL planning, an Arrow round trip through
#: Python workers, a shuffle, persisted data read back to the driver.
_PROBE = """
from kafka_eos.spark_io import get_session
spark = get_session("kafka-eos-cds-probe")
def same(batches):
    yield from batches
df = spark.range(1000).selectExpr("id", "cast(id % 7 as string) as k", "cast(id as string) as value")
df = df.mapInArrow(same, df.schema).persist()
assert len(df.groupBy("k").count().collect()) == 7
assert sum(1 for _ in df.toLocalIterator(prefetchPartitions=True)) == 1000
spark.stop()
"""


def _digest(jars: list[str]) -> str:
    """What the archive depends on: the JDK, pyspark's jars and the connector's jars."""
    import pyspark

    java = shutil.which("java") or ""
    spark_jars = Path(pyspark.__file__).parent / "jars"
    parts = [os.path.realpath(java), os.environ.get("JAVA_HOME", ""), pyspark.__version__,
             *sorted(f"{p.name}:{p.stat().st_size}" for p in spark_jars.glob("*.jar")),
             *sorted(f"{Path(j).name}:{Path(j).stat().st_size}" for j in jars)]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def _archive_path(folder: Path) -> tuple[Path, list[str]]:
    """Where the archive of this JDK, pyspark and connector jars is (or goes), and those jars."""
    jars = connector_jars()
    return folder / f"spark-{_digest(jars)}.jsa", jars


def class_data_archive(folder: Path) -> Path:
    """The archive for this JDK and pyspark under ``folder``, made by a probe spark-submit when
    there is none yet.

    :raises RuntimeError: the probe failed or timed out (its exit and the end of its stderr)."""
    archive, jars = _archive_path(folder)
    if archive.exists():
        return archive
    folder.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="probe-", dir=folder) as tmp:  # os.replace stays on one filesystem
        probe, partial = Path(tmp) / "probe.py", Path(tmp) / "spark.jsa"
        probe.write_text(_PROBE)
        env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable,
               "SPARK_SUBMIT_OPTS": f"{BASE_OPTS} -XX:ArchiveClassesAtExit={partial} -Xlog:cds=off"}
        env.pop("SPARK_CONF_DIR", None)
        spark_submit = Path(sys.executable).parent / "spark-submit"
        try:
            done = subprocess.run([str(spark_submit), "--master", "local[2]", "--jars", ",".join(jars), str(probe)],
                                  env=env, capture_output=True, text=True, timeout=PROBE_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            done = None
        if done is None or done.returncode != 0 or not partial.exists():
            raise RuntimeError("timed out" if done is None else f"exit {done.returncode}: {done.stderr.strip()[-300:]}")
        os.replace(partial, archive)  # atomic: a concurrent session sees a whole archive or none
    for stale in set(folder.glob("spark-*.jsa")) - {archive}:  # another JDK's or pyspark's: ~150 MB each
        stale.unlink(missing_ok=True)  # a driver mapping it now keeps its mapping
    print(f"spark class-data archive made in {time.monotonic() - started:.0f}s: {archive}", file=sys.stderr)
    return archive


def driver_environ(environ=os.environ) -> tuple[dict[str, str], threading.Thread | None]:
    """The environment settings of the demo's and a test session's Spark drivers, each kept where
    ``environ`` already sets it: ``SPARK_SUBMIT_OPTS`` (:func:`spark_submit_opts`) and Spark's
    launcher's :data:`LAUNCHER_OPTS_ENV`; with the thread making the archive, if one is made."""
    archive = None
    opts = environ.get("SPARK_SUBMIT_OPTS")
    if opts is None:
        opts, archive = spark_submit_opts()
    return {"SPARK_SUBMIT_OPTS": opts, LAUNCHER_OPTS_ENV: environ.get(LAUNCHER_OPTS_ENV, BASE_OPTS)}, archive


def spark_submit_opts(folder: Path | None = None) -> tuple[str, threading.Thread | None]:
    """``SPARK_SUBMIT_OPTS`` for the demo's or a test session's Spark drivers, and the thread
    making the archive they name (under ``folder``, default ``.local/spark-cds/``, which the demo
    and the tests share) when there is none yet (a probe job, some 25 s on a clean clone): join it before the
    first driver starts. (A driver started before the archive is in place finds no file there and
    starts without it, silently: the JVM's default ``-Xshare:auto``; the archive appears whole,
    ``os.replace``, for every later one.)"""
    folder = folder or local_dir() / "spark-cds"  # the demo's and the tests' one archive
    try:
        archive, _jars = _archive_path(folder)
    except Exception as exc:  # noqa: BLE001 - no jars yet, no pyspark: only slower
        print(f"spark class-data archive not made ({exc}); Spark drivers start without it", file=sys.stderr)
        return BASE_OPTS, None
    maker = None
    if not archive.exists():
        def make() -> None:
            try:
                class_data_archive(folder)
            except Exception as exc:  # noqa: BLE001 - the probe failed: drivers only start slower
                print(f"spark class-data archive not made ({exc}); Spark drivers start without it", file=sys.stderr)

        maker = threading.Thread(target=make, name="spark-class-data-archive", daemon=True)
        maker.start()
    # -Xlog:cds=off: a driver whose class path differs from the probe's, or started before the
    # archive exists, says nothing and starts without it.
    return f"{BASE_OPTS} -XX:SharedArchiveFile={archive} -Xlog:cds=off -Xlog:cds+dynamic=off", maker
