package io.kafkaeos.connect;

import java.lang.reflect.Method;
import java.util.ArrayList;
import java.util.List;
import java.util.Optional;

import org.apache.spark.Dependency;
import org.apache.spark.Partition;
import org.apache.spark.connect.proto.Relation;
import org.apache.spark.rdd.RDD;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.RowFactory;
import org.apache.spark.sql.catalyst.plans.logical.LogicalPlan;
import org.apache.spark.sql.classic.Dataset;
import org.apache.spark.sql.classic.SparkSession;
import org.apache.spark.sql.connect.plugin.RelationPlugin;
import org.apache.spark.sql.connect.planner.SparkConnectPlanner;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructType;
import org.sparkproject.connect.protobuf.Any;
import org.sparkproject.connect.protobuf.InvalidProtocolBufferException;

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
 * on the server, its records produced from the server's executors ({@link PartitionCommitsRelation}).
 *
 * <p>Loaded with {@code spark.connect.extensions.relation.classes=io.kafkaeos.connect.ReadLayoutPlugin}.
 */
public final class ReadLayoutPlugin implements RelationPlugin {

    /** The extension's type: what the Python client sends. */
    public static final String TYPE_URL = "type.googleapis.com/kafka_eos.ReadLayout";

    private static final String ONE_TO_ONE = "org.apache.spark.OneToOneDependency";
    private static final String KAFKA_READ = "org.apache.spark.sql.kafka010.KafkaSourceRDD";

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
            if (PartitionCommitsRelation.TYPE_URL.equals(any.getTypeUrl())) {
                return Optional.of(PartitionCommitsRelation.transform(any.getValue().toByteArray(), planner));
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
        List<Row> tasks = layout(Dataset.ofRows(session, plan).queryExecution().toRdd());
        return Optional.of(session.createDataFrame(tasks, SCHEMA).logicalPlan());
    }

    /** One row per task of the Kafka read under {@code rdd}, or none where it is not proven. */
    static List<Row> layout(RDD<?> rdd) {
        while (!rdd.getClass().getName().equals(KAFKA_READ)) {
            scala.collection.immutable.Seq<Dependency<?>> dependencies = rdd.dependencies();
            if (dependencies.size() != 1 || !dependencies.head().getClass().getName().equals(ONE_TO_ONE)) {
                return List.of();
            }
            rdd = dependencies.head().rdd();
        }
        List<Row> tasks = new ArrayList<>();
        try {
            for (Partition task : rdd.partitions()) {
                // The connector's classes are Scala-private (public in bytecode): read by reflection,
                // as the Python side reads them through py4j.
                Object range = call(task, "offsetRange");
                Object tp = call(range, "topicPartition");
                tasks.add(RowFactory.create(task.index(), call(tp, "topic"), call(tp, "partition"),
                        call(range, "fromOffset"), call(range, "untilOffset")));
            }
        } catch (ReflectiveOperationException e) {
            return List.of(); // another version of the connector: not proven
        }
        return tasks;
    }

    private static Object call(Object target, String method) throws ReflectiveOperationException {
        Method m = target.getClass().getMethod(method);
        m.setAccessible(true);
        return m.invoke(target);
    }
}
