package io.kafkaeos.writer;

import java.util.Iterator;

import org.apache.spark.sql.catalyst.InternalRow;

/**
 * A task's input, Spark's own iterator, whose failures (the read, the transform, a Python UDF's worker)
 * are told apart from the transaction's: the task aborts its transaction and fails with the input's own
 * error, as it was raised.
 */
final class Input implements Iterator<InternalRow> {

    /** The input's error, carried past the transaction's handlers. */
    static final class Failed extends RuntimeException {
        private static final long serialVersionUID = 1L;

        Failed(Throwable cause) {
            super(cause.toString(), cause, false, false);
        }
    }

    private final Iterator<InternalRow> spark;

    Input(Iterator<InternalRow> spark) {
        this.spark = spark;
    }

    @Override
    public boolean hasNext() {
        try {
            return spark.hasNext();
        } catch (Throwable t) {
            throw new Failed(t);
        }
    }

    @Override
    public InternalRow next() {
        try {
            return spark.next();
        } catch (Throwable t) {
            throw new Failed(t);
        }
    }
}
