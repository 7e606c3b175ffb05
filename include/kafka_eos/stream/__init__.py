"""Stream mode: one long-lived Spark application that runs a pipeline's batch step over and over,
small committed ranges one after another, each exactly once (:mod:`.loop`); and the lease that
makes a stream and scheduled batch runs take turns rather than fence each other (:mod:`.lease`).

See docs/stream.md.
"""
