"""The provider's import paths before it took Airflow's layout (hooks/, operators/, sensors/,
triggers/, notifications/, assets/, plugins/): they keep working for one release, each use
warning where the name lives now (CHANGELOG, "Upgrading")."""

from __future__ import annotations

import importlib
import warnings
from typing import Any, Callable

from airflow.exceptions import AirflowProviderDeprecationWarning


def moved(old: str, new: str, submodules: tuple[str, ...] = ()) -> Callable[[str], Any]:
    """A module ``__getattr__`` for the old module ``old``, whose names are in ``new`` now.

    :param submodules: ``old`` is now a package: these are its modules, imported without a warning.
    """
    warned: set[str] = set()

    def __getattr__(name: str) -> Any:
        if name in submodules:
            return importlib.import_module(f"{old}.{name}")
        if name.startswith("__"):
            raise AttributeError(name)
        value = getattr(importlib.import_module(new), name)
        if name in warned:  # once per name: `from old import name` asks twice
            return value
        warned.add(name)
        warnings.warn(f"{old}.{name} is deprecated: import it from {new} (the old path goes in the next release)",
                      AirflowProviderDeprecationWarning, stacklevel=2)
        return value

    return __getattr__
