package io.kafkaeos.connect;

import java.util.List;
import java.util.Optional;

import org.apache.spark.connect.proto.Relation;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.catalyst.plans.logical.LogicalPlan;
import org.apache.spark.sql.classic.Dataset;
import org.apache.spark.sql.classic.SparkSession;
import org.apache.spark.sql.connect.plugin.RelationPlugin;
import org.apache.spark.sql.connect.planner.SparkConnectPlanner;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructType;
import org.sparkproject.connect.protobuf.Any;
import org.sparkproject.connect.protobuf.InvalidProtocolBufferException;

import io.kafkaeos.writer.ReadLayout;

/**
 * What each Spark task of a DataFrame reads from Kafka, answered by the Spark Connect server: the
 * relation {@code kafka_eos.ReadLayout} (a {@code Relation.extension} whose value is the serialized
 * {@code Relation} of the DataFrame) becomes a local relation of one row per task of the Kafka read,
 * {@code (task, topic, partition, from_offset, until_offset)}, or of no rows where the lineage of
 * the RDD the server runs for the DataFrame does not prove it.
 *
 * <p>The proof is kafka-eos's {@code spark_io.read_layout}, on the server's side: every dependency
 * from the DataFrame's RDD back to Spark's Kafka read is one-to-one (task <i>i</i>'s rows come
 * from read task <i>i</i> only: no union, no coalesce, no shuffle). Nothing runs: the plan is
 * analysed and planned, as for an {@code explain}.
 *
 * <p>The same plugin answers {@code kafka_eos.PartitionCommits}: per_partition scope's commit job run
 * on the server, its records produced from the server's executors, and {@code kafka_eos.AtomicCommit}:
 * the atomic scope's transaction in the server's driver JVM ({@link PartitionCommitsRelation}).
 *
 * <p>Loaded with {@code spark.connect.extensions.relation.classes=io.kafkaeos.connect.ReadLayoutPlugin}.
 */
public final class ReadLayoutPlugin implements RelationPlugin {

    /** The extension's type: what the Python client sends. */
    public static final String TYPE_URL = "type.googleapis.com/kafka_eos.ReadLayout";

    /** The answer's columns. */
    public static final StructType SCHEMA = new StructType()
            .add("task", DataTypes.IntegerType, false)
            .add("topic", DataTypes.StringType, false)
            .add("partition", DataTypes.IntegerType, false)
            .add("from_offset", DataTypes.LongType, false)
            .add("until_offset", DataTypes.LongType, false);

    @Override
    public Optional<LogicalPlan> transform(byte[] extension, SparkConnectPlanner planner) {
        Relation input;
        try {
            Any any = Any.parseFrom(extension);
            if (PartitionCommitsRelation.TYPE_URL.equals(any.getTypeUrl())
                    || PartitionCommitsRelation.ATOMIC_TYPE_URL.equals(any.getTypeUrl())) {
                return Optional.of(PartitionCommitsRelation.transform(any.getValue().toByteArray(), planner,
                        PartitionCommitsRelation.ATOMIC_TYPE_URL.equals(any.getTypeUrl())));
            }
            if (!TYPE_URL.equals(any.getTypeUrl())) {
                return Optional.empty(); // another plugin's
            }
            input = Relation.parseFrom(any.getValue());
        } catch (InvalidProtocolBufferException e) {
            throw new IllegalArgumentException("kafka_eos.ReadLayout: the extension's value is not a Relation", e);
        }
        SparkSession session = planner.session();
        LogicalPlan plan = planner.transformRelation(input);
        List<Row> tasks = ReadLayout.layout(Dataset.ofRows(session, plan).queryExecution().toRdd());
        return Optional.of(session.createDataFrame(tasks, SCHEMA).logicalPlan());
    }
}
