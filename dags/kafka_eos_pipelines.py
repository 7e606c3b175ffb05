"""One DAG per pipeline spec in the pipelines folder (``[kafka_eos] pipelines_folder``, else
``KAFKA_EOS_PIPELINES_DIR``, in a checkout the bundled examples in include/pipelines/): ``kafka_eos__<name>`` (plan >> spark >> verify) and
``kafka_eos_stream__<name>``.

DAG wiring only: the factory is ``kafka_eos_airflow.dag_factory``, which a DAG file of your own
calls the same way.
"""

from __future__ import annotations

from kafka_eos_airflow.config import pipelines_folder
from kafka_eos_airflow.dag_factory import (DAG_ID_PREFIX, STREAM_DAG_ID_PREFIX, build_dag,  # noqa: F401
                                           build_stream_dag, dags_from_folder)

globals().update(dags_from_folder(pipelines_folder()))
