"""Where log lines go: a person at a terminal sees one line per step; everything else goes to a
log file under ``.local/logs/`` (or to stderr with ``-v``).

Three sources would otherwise write to the terminal on their own:

- librdkafka (every confluent-kafka client) logs to stderr by itself; :class:`KafkaSettings`
  gives every client the ``kafka_eos.librdkafka`` Python logger instead;
- Spark's JVM logs through log4j2 to the console; :func:`spark_log4j_options` points it at a file;
- py4j logs each gateway connection at INFO.

The library attaches no handler of its own (a ``NullHandler`` keeps Python from printing
warnings of an unconfigured process, such as a Spark Python worker); entry points call
:func:`setup_cli_logging`.
"""

from __future__ import annotations

import logging
import os
import sys
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from kafka_eos.paths import local_dir
from kafka_eos.settings import CLIENT_LOGGER

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

def log4j2_properties(log_file: Path, root_level: str, levels: dict[str, str] | None = None) -> str:
    """A log4j2 configuration that writes every JVM log line to ``log_file`` (the local broker's
    and Spark's), at ``root_level``, with ``levels`` for named loggers."""
    lines = [
        "status = warn",
        "appender.file.type = File",
        "appender.file.name = FILE",
        f"appender.file.fileName = {log_file}",
        "appender.file.layout.type = PatternLayout",
        "appender.file.layout.pattern = [%d] %p %m (%c)%n%ex",
        f"rootLogger.level = {root_level}",
        "rootLogger.appenderRef.file.ref = FILE",
    ]
    for i, (name, level) in enumerate(sorted((levels or {}).items())):
        lines += [f"logger.l{i}.name = {name}", f"logger.l{i}.level = {level}"]
    return "\n".join(lines) + "\n"


def logs_dir() -> Path:
    """``.local/logs``: the CLI's log file and Spark's driver log."""
    folder = local_dir() / "logs"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def cli_log_file() -> Path:
    return logs_dir() / "kafka-eos.log"


def spark_log_file() -> Path:
    return logs_dir() / "spark.log"


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is at the time of the record (not at creation)."""

    @property  # type: ignore[override]
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, _value) -> None:
        pass


def setup_cli_logging(verbose: bool = False) -> Path:
    """Send every Python log record (librdkafka's included) to the CLI's log file, and with
    ``verbose`` to stderr too. Returns the log file.

    Idempotent: a second call (tests run many commands in one process) replaces the handlers it
    added before, and touches no other handler.
    """
    reset_cli_logging()
    root = logging.getLogger()
    log_file = cli_log_file()
    file_handler = logging.FileHandler(log_file)
    file_handler.setFormatter(logging.Formatter(LOG_FORMAT))
    handlers: list[logging.Handler] = [file_handler]
    if verbose:
        handlers.append(_StderrHandler())
        handlers[-1].setFormatter(logging.Formatter(LOG_FORMAT))
    for handler in handlers:
        handler._kafka_eos = True  # type: ignore[attr-defined]
        root.addHandler(handler)
    root.setLevel(logging.DEBUG if verbose else logging.INFO)
    # py4j logs every gateway call at DEBUG and each connection at INFO: of no use to a user.
    logging.getLogger("py4j").setLevel(logging.WARNING)
    # kafka-python (the transaction admin API) logs every connection at INFO.
    logging.getLogger("kafka").setLevel(logging.WARNING)
    return log_file


@contextmanager
def root_logging_kept() -> Iterator[None]:
    """In the CLI (:func:`setup_cli_logging`), the root logger's handlers and level as they were
    before the block, whatever it imports: Airflow configures logging when first imported (an
    Airflow connection resolved by the CLI), and its handlers would print the CLI's log records,
    tracebacks included, on stdout. Elsewhere the block changes nothing."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    if not any(getattr(h, "_kafka_eos", False) for h in handlers):
        yield  # not the CLI's log (a spark-submit driver's): what Airflow sets up is its log
        return
    try:
        yield
    finally:
        for handler in [h for h in root.handlers if h not in handlers]:
            root.removeHandler(handler)
        for handler in handlers:
            if handler not in root.handlers:
                root.addHandler(handler)
        root.setLevel(level)


def reset_cli_logging() -> None:
    """Remove the handlers :func:`setup_cli_logging` added (tests call the CLI many times)."""
    root = logging.getLogger()
    for handler in [h for h in root.handlers if getattr(h, "_kafka_eos", False)]:
        root.removeHandler(handler)
        handler.close()


def spark_log4j_options(verbose: bool = False) -> str:
    """Driver JVM options that send Spark's log4j2 output to :func:`spark_log_file`
    (``spark.driver.extraJavaOptions`` of an in-process session)."""
    config = logs_dir() / "log4j2-spark.properties"
    config.write_text(log4j2_properties(spark_log_file(), "INFO" if verbose else "WARN"))
    return f"-Dlog4j2.configurationFile=file:{config}"


#: PySpark's own loggers for an analysis error's context: each writes a JSON line of several
#: kilobytes (a JVM stack trace in it) to stderr through a handler of its own, and never propagates.
PYSPARK_CONTEXT_LOGGERS = ("DataFrameQueryContextLogger", "SQLQueryContextLogger")


def pyspark_loggers_to_cli_log() -> None:
    """Send :data:`PYSPARK_CONTEXT_LOGGERS` to the CLI's log file (:func:`setup_cli_logging`)
    instead of stderr, where the CLI prints the error's one line itself. Call once pyspark is
    imported (a run's session)."""
    from pyspark.logger import PySparkLogger

    for name in PYSPARK_CONTEXT_LOGGERS:
        logger = PySparkLogger.getLogger(name)
        for handler in list(logger.handlers):
            logger.removeHandler(handler)
            handler.close()
        # A handler of their own: PySparkLogger gives the handlers it is given its JSON formatter.
        logger.addHandler(logging.FileHandler(cli_log_file()))


@contextmanager
def child_stderr_to(log_file: Path, enabled: bool = True) -> Iterator[None]:
    """Inside the block, file descriptor 2 points at ``log_file``: a child process started
    there (PySpark's JVM, and through it the Python workers) keeps writing its stderr to the
    file, e.g. the JVM's own "WARNING: Using incubator modules" that no log4j setting reaches.
    This process's stderr is restored on exit."""
    if not enabled:
        yield
        return
    sys.stderr.flush()
    saved = os.dup(2)
    with open(log_file, "ab") as target:
        os.dup2(target.fileno(), 2)
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)


@dataclass
class _Seen:
    message: str | None = None


class _LastError(logging.Handler):
    def __init__(self, seen: _Seen) -> None:
        super().__init__(logging.WARNING)
        self.seen = seen

    def emit(self, record: logging.LogRecord) -> None:
        # librdkafka's lines look like "FAIL [rdkafka#producer-1] [thrd:...]: host:port/bootstrap:
        # Connect to ipv4#127.0.0.1:1 failed: Connection refused (after 0ms in state CONNECT)".
        text = record.getMessage()
        self.seen.message = text.rsplit("]: ", 1)[-1]


@contextmanager
def last_client_error() -> Iterator[_Seen]:
    """Remember the last warning or error librdkafka logged inside the block (what a
    connection attempt ran into), to name it in a one-line error."""
    seen = _Seen()
    handler = _LastError(seen)
    CLIENT_LOGGER.addHandler(handler)
    try:
        yield seen
    finally:
        CLIENT_LOGGER.removeHandler(handler)
