"""An auth manager with per-DAG permissions for the test deployment: Airflow's simple auth manager,
where the users named in ``$KAFKA_EOS_LAB_DAG_ACCESS`` (a JSON object: user -> DAG id patterns,
``fnmatch`` style) may read only the DAGs their patterns match, and not "every DAG". What an
estate's auth manager does with per-DAG roles or teams; the operator page's filter is proved
against it through the auth manager's own interface (``get_authorized_dag_ids``), on a real
API server (``AIRFLOW__CORE__AUTH_MANAGER=kafka_eos_lab.auth.DagPatternAuthManager``).
"""

from __future__ import annotations

import json
import os
from fnmatch import fnmatchcase

from airflow.api_fastapi.auth.managers.simple.simple_auth_manager import SimpleAuthManager

#: The environment variable with the users' patterns.
ACCESS_ENV = "KAFKA_EOS_LAB_DAG_ACCESS"


def _patterns(user: str) -> list[str] | None:
    return json.loads(os.environ.get(ACCESS_ENV) or "{}").get(user)


class DagPatternAuthManager(SimpleAuthManager):
    """:class:`SimpleAuthManager`, with DAG permissions by pattern for the users named."""

    def is_authorized_dag(self, *, method, user, access_entity=None, details=None) -> bool:
        patterns = _patterns(user.get_name())
        if patterns is not None and (details is None or details.id is None
                                     or not any(fnmatchcase(details.id, p) for p in patterns)):
            return False
        return super().is_authorized_dag(method=method, user=user, access_entity=access_entity, details=details)
