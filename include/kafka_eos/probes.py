"""Named points on the commit path where a test or the lab may act (crash, pause), and nothing
happens otherwise.

A run passes :func:`point` at each step a fault matrix cares about (``after_produce``,
``before_offsets``, ``before_commit``, ``after_commit``, ``before_sql_commit``,
``after_sql_commit``: docs/chaos.md). With no probe installed — every deployment: the wheel holds
none — a point is one test of a module global. The repository's tests and its lab install one
(``kafka_eos_lab.faults``) by naming its module in :data:`PROBES_ENV`; every process that imports
kafka-eos with that set (a spark-submit, an Airflow task, a Spark worker) installs it at import.

Where the process that commits does not inherit the run's environment (a Spark Connect server's
Python workers), a task carries the probe's settings (:func:`carried`) and applies them while it
runs (:func:`applied`).
"""

from __future__ import annotations

import importlib
import os
import warnings
from contextlib import contextmanager, nullcontext
from typing import ContextManager, Iterator, Protocol

#: The module that installs a probe when imported (tests and the lab only; unset in deployments).
PROBES_ENV = "KAFKA_EOS_PROBES"


class Probe(Protocol):
    """What a probe does at the points (``kafka_eos_lab.faults`` is one)."""

    def point(self, name: str) -> None: ...

    def armed(self, name: str) -> bool: ...

    def carried(self) -> dict[str, str]: ...

    def applied(self, settings: dict[str, str]) -> ContextManager[None]: ...


_probe: Probe | None = None
_probe_module: str | None = None


def install(probe: Probe, module: str) -> None:
    """Make ``probe`` (from ``module``, named to processes a task carries it to) act at the points."""
    global _probe, _probe_module
    _probe, _probe_module = probe, module


def point(name: str) -> None:
    """A point on the commit path: the installed probe acts here, if there is one."""
    if _probe is not None:
        _probe.point(name)


def armed(name: str) -> bool:
    """Whether the installed probe will act at ``name`` (a point a loop passes often asks first)."""
    return _probe is not None and _probe.armed(name)


def carried() -> dict[str, str]:
    """The installed probe's settings, for a task to take where the environment does not reach."""
    if _probe is None:
        return {}
    settings = _probe.carried()
    return {PROBES_ENV: _probe_module, **settings} if settings else {}


@contextmanager
def applied(settings: dict[str, str]) -> Iterator[None]:
    """Inside the block, ``settings`` (from :func:`carried`) are this process's probe settings."""
    if not settings:
        yield
        return
    if _probe is None:
        importlib.import_module(settings[PROBES_ENV])  # it installs itself
    with _probe.applied({k: v for k, v in settings.items() if k != PROBES_ENV}) if _probe else nullcontext():
        yield


def _load() -> None:
    module = os.environ.get(PROBES_ENV)
    if not module:
        return
    try:
        importlib.import_module(module)  # it calls install()
    except ImportError as exc:  # a deployment that carries the tests' setting: its points stay inert
        warnings.warn(f"{PROBES_ENV}={module}: no probe installed ({exc})", RuntimeWarning, stacklevel=2)


_load()
