"""Stream mode: one long-lived Spark application that runs a pipeline's batch step over and over,
small committed ranges one after another, each exactly once (:mod:`.loop`); and the lease that
makes a stream and scheduled batch runs take turns rather than fence each other
(:mod:`kafka_eos.lease`).

See docs/stream.md.
"""

from __future__ import annotations

from typing import Mapping

#: Set by whoever starts ``kafka-eos stream`` for a task of its own (the stream DAG's operator):
#: its process id. The stream stops after its batch in flight once that process is gone.
PARENT_PID_ENV = "KAFKA_EOS_STREAM_PARENT_PID"
#: A stream's least time between the starts of two batches, where nobody sets one: Kafka Streams'
#: commit interval under exactly-once (100 ms). An idle stream asks for its partitions' ends this
#: often (a ListOffsets request); a busy one runs its batches back to back.
DEFAULT_INTERVAL_S = 0.1
#: Spark settings of a stream's own session, under the pipeline's (a spec's ``spark:`` section wins).
#: PySpark's DataFrame call-site capture (on by default since Spark 4) costs every DataFrame
#: function in a batch's transform and output columns about ten more Py4J round trips (the active
#: session, a setting, the origin): 243 round trips to build an identity batch's DataFrame instead
#: of 93, ~30 ms of a 0.2 s batch. Off, an error in a Spark job names the transform's expression
#: but not the Python line that built it (``kafka-eos run`` of the same pipeline still does).
SESSION_CONF = {"spark.python.sql.dataFrameDebugging.enabled": "false"}


def session_conf(pipeline_conf: Mapping[str, str]) -> dict[str, str]:
    """A stream's Spark settings: :data:`SESSION_CONF` under the pipeline's own."""
    # spark_io loads the Kafka client: the DAG files import this package (its constants) at parse time.
    from kafka_eos.spark_io import merged_conf

    return merged_conf(SESSION_CONF, pipeline_conf)
