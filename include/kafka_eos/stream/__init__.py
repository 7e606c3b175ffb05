"""Stream mode: one long-lived Spark application that runs a pipeline's batch step over and over,
small committed ranges one after another, each exactly once (:mod:`.loop`); and the lease that
makes a stream and scheduled batch runs take turns rather than fence each other (:mod:`.lease`).

See docs/stream.md.
"""

#: Set by whoever starts ``kafka-eos stream`` for a task of its own (the stream DAG's operator):
#: its process id. The stream stops after its batch in flight once that process is gone.
PARENT_PID_ENV = "KAFKA_EOS_STREAM_PARENT_PID"
#: A stream's least time between the starts of two batches, where nobody sets one: Kafka Streams'
#: commit interval under exactly-once (100 ms). An idle stream asks for its partitions' ends this
#: often (a ListOffsets request); a busy one runs its batches back to back.
DEFAULT_INTERVAL_S = 0.1
