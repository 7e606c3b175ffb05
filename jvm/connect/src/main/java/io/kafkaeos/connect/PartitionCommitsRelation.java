package io.kafkaeos.connect;

import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;

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
 * per_partition scope's commit job asked of the Spark Connect server (the relation
 * {@code kafka_eos.PartitionCommits}): the server runs {@link PartitionCommits#commit} over the
 * client's DataFrame, its records produced from the server's executors, and answers a local relation
 * of the tasks' results, one JSON text per row (column {@code result}).
 *
 * <p>The extension's value: the DataFrame's serialized {@code Relation}, its length first (4 bytes,
 * big-endian), then the job (JSON, UTF-8). The job runs while the relation is planned, once per
 * request: the client collects the answer once, and each request carries a new job id, so that no
 * cache of planned relations could answer a second request without running it.
 */
final class PartitionCommitsRelation {

    /** The extension's type: what the Python client sends. */
    static final String TYPE_URL = "type.googleapis.com/kafka_eos.PartitionCommits";

    static final StructType SCHEMA = new StructType().add("result", DataTypes.StringType, false);

    private PartitionCommitsRelation() {
    }

    static LogicalPlan transform(byte[] value, SparkConnectPlanner planner) {
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
            throw new IllegalArgumentException("kafka_eos.PartitionCommits: the extension's value holds no Relation", e);
        }
        SparkSession session = planner.session();
        LogicalPlan plan = planner.transformRelation(input);
        String[] results = PartitionCommits.commit(Dataset.ofRows(session, plan), new String(job, StandardCharsets.UTF_8));
        List<Row> rows = new ArrayList<>();
        for (String result : results) {
            rows.add(RowFactory.create(result));
        }
        return session.createDataFrame(rows, SCHEMA).logicalPlan();
    }
}
