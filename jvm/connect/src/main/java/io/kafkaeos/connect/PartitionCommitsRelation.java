package io.kafkaeos.connect;

import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;

import io.kafkaeos.writer.AtomicTransaction;
import io.kafkaeos.writer.PartitionCommits;

import org.apache.spark.connect.proto.Relation;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.RowFactory;
import org.apache.spark.sql.catalyst.plans.logical.LogicalPlan;
import org.apache.spark.sql.classic.Dataset;
import org.apache.spark.sql.classic.SparkSession;
import org.apache.spark.sql.connect.planner.SparkConnectPlanner;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructType;
import org.sparkproject.connect.protobuf.InvalidProtocolBufferException;

/**
 * A Kafka sink's transactions asked of the Spark Connect server. {@code kafka_eos.PartitionCommits}:
 * per_partition scope's commit job, {@link PartitionCommits#commit} over the client's DataFrame, its
 * records produced from the server's executors; the answer is a local relation of the tasks' results,
 * one JSON text per row (column {@code result}). {@code kafka_eos.AtomicCommit}: the atomic scope's
 * transaction, {@link AtomicTransaction#commit}, in the server's driver JVM; the answer is its one
 * result.
 *
 * <p>The extension's value: the DataFrame's serialized {@code Relation}, its length first (4 bytes,
 * big-endian), then the job (JSON, UTF-8). The job runs while the relation is planned, once per
 * request: the client collects the answer once, and each request carries a new job id, so that no
 * cache of planned relations could answer a second request without running it.
 */
final class PartitionCommitsRelation {

    /** The extension's type: what the Python client sends. */
    static final String TYPE_URL = "type.googleapis.com/kafka_eos.PartitionCommits";
    /** The atomic scope's: the whole plan's transaction. */
    static final String ATOMIC_TYPE_URL = "type.googleapis.com/kafka_eos.AtomicCommit";

    static final StructType SCHEMA = new StructType().add("result", DataTypes.StringType, false);

    private PartitionCommitsRelation() {
    }

    /** {@code e} thrown as it is, checked or not (as Scala code throws it): the client reads its text. */
    @SuppressWarnings("unchecked")
    private static <E extends Exception> E asIs(Exception e) throws E {
        throw (E) e;
    }

    static LogicalPlan transform(byte[] value, SparkConnectPlanner planner, boolean atomic) {
        ByteBuffer buffer = ByteBuffer.wrap(value);
        int length = buffer.getInt();
        byte[] relation = new byte[length];
        buffer.get(relation);
        byte[] job = new byte[buffer.remaining()];
        buffer.get(job);
        Relation input;
        try {
            input = Relation.parseFrom(relation);
        } catch (InvalidProtocolBufferException e) {
            throw new IllegalArgumentException("kafka_eos." + (atomic ? "AtomicCommit" : "PartitionCommits")
                    + ": the extension's value holds no Relation", e);
        }
        SparkSession session = planner.session();
        LogicalPlan plan = planner.transformRelation(input);
        String text = new String(job, StandardCharsets.UTF_8);
        String[] results;
        try {
            results = atomic ? new String[] {AtomicTransaction.commit(Dataset.ofRows(session, plan), text)}
                    : PartitionCommits.commit(Dataset.ofRows(session, plan), text);
        } catch (Exception e) {
            throw PartitionCommitsRelation.<RuntimeException>asIs(e); // the job's own error (a SparkException), unwrapped
        }
        List<Row> rows = new ArrayList<>();
        for (String result : results) {
            rows.add(RowFactory.create(result));
        }
        return session.createDataFrame(rows, SCHEMA).logicalPlan();
    }
}
