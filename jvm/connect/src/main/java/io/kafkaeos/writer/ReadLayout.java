package io.kafkaeos.writer;

import java.lang.reflect.Method;
import java.util.ArrayList;
import java.util.List;

import org.apache.spark.Dependency;
import org.apache.spark.Partition;
import org.apache.spark.rdd.RDD;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.RowFactory;

/**
 * What each Spark task of an RDD reads from Kafka, where its lineage proves it (kafka-eos's
 * {@code spark_io.read_layout}): every dependency from the RDD back to Spark's Kafka read is
 * one-to-one (task <i>i</i>'s rows come from read task <i>i</i> only: no union, no coalesce, no
 * shuffle). Nothing runs. Asked by the Spark Connect plugin's {@code kafka_eos.ReadLayout}, and by
 * {@link AtomicTransaction} for the order of the job it runs.
 */
public final class ReadLayout {

    private static final String ONE_TO_ONE = "org.apache.spark.OneToOneDependency";
    private static final String KAFKA_READ = "org.apache.spark.sql.kafka010.KafkaSourceRDD";

    private ReadLayout() {
    }

    /**
     * One row per task of the Kafka read under {@code rdd}, {@code (task, topic, partition, from_offset,
     * until_offset)}, or none where it is not proven.
     */
    public static List<Row> layout(RDD<?> rdd) {
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
