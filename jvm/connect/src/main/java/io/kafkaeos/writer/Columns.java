package io.kafkaeos.writer;

import java.io.Serializable;
import java.util.Arrays;

import org.apache.spark.sql.types.ArrayType;
import org.apache.spark.sql.types.StructType;

/**
 * Where the sink's columns are in the commit job's rows (kafka-eos's {@code batches.prepared}: key and
 * value as binary, headers when the transform carries them, the source's topic, partition and offset,
 * and {@code dlq_reason}); found once on the driver, from the rows' schema.
 */
final class Columns implements Serializable {
    private static final long serialVersionUID = 1L;

    final int key;
    final int value;
    /** -1: no headers column. */
    final int headers;
    final int topic;
    final int partition;
    final int offset;
    final int reason;
    /** The key's and the value's ordinals in a header's struct (-1: no headers column). */
    final int headerKey;
    final int headerValue;

    Columns(StructType schema) {
        this.key = schema.fieldIndex("key");
        this.value = schema.fieldIndex("value");
        this.headers = Arrays.asList(schema.fieldNames()).contains("headers") ? schema.fieldIndex("headers") : -1;
        this.topic = schema.fieldIndex("topic");
        this.partition = schema.fieldIndex("partition");
        this.offset = schema.fieldIndex("offset");
        this.reason = schema.fieldIndex("dlq_reason");
        if (headers < 0) {
            this.headerKey = -1;
            this.headerValue = -1;
        } else {
            StructType header = (StructType) ((ArrayType) schema.fields()[headers].dataType()).elementType();
            this.headerKey = header.fieldIndex("key");
            this.headerValue = header.fieldIndex("value");
        }
    }
}
