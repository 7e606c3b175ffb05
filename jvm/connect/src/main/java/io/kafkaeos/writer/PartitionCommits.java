package io.kafkaeos.writer;

import java.util.ArrayList;
import java.util.Collections;
import java.util.Iterator;
import java.util.List;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ObjectNode;

import org.apache.spark.TaskContext;
import org.apache.spark.api.java.function.FlatMapFunction;
import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.execution.QueryExecution;
import org.apache.spark.sql.execution.SQLExecution;

import scala.Option;

/**
 * per_partition scope's commit job with the records produced from the executors' JVM: one Kafka
 * transaction per Spark task, under its source partition's own transactional.id, the steps of
 * {@code kafka_eos.txn} ({@link PartitionTransaction}). The rows never reach Python: Spark's own
 * iterator feeds the producer, and a read or transform that fails throws through it, so a
 * transaction commits only after its input ended as Spark ended it.
 *
 * <p>The driver (kafka-eos's {@code kafka_eos.sinks.jvm_writer}) proves the task layout first
 * (each task holds one whole planned range: the lineage proof), and hands the job: the producer's
 * settings, the ids, each task's range, the sink's topics and limits. Each task returns one JSON
 * object, as the Python commit task does ({@code per_partition._result_row}), with the rows it took
 * from Spark's iterator ({@code rows}); a task with no rows returns none (the driver commits its
 * range offsets-only).
 *
 * <p>Called through Py4J: {@code PartitionCommits.commit(dataset, jobJson)}.
 */
public final class PartitionCommits {

    static final ObjectMapper JSON = new ObjectMapper();

    private PartitionCommits() {
    }

    /**
     * Run the commit job over {@code rows} (the sink's prepared columns: key, value, [headers],
     * topic, partition, offset, dlq_reason) and return each task's result, a JSON object each.
     */
    public static String[] commit(Dataset<Row> rows, String job) {
        // Spark's own rows (InternalRow), as its Kafka sink reads them: no Row object per record. The
        // job is one SQL execution of the rows' query, as a Dataset's action is: its observations
        // (kafka-eos's count of the rows each partition's task is given) are filled, and listeners
        // (the SQL tab, OpenLineage) see it.
        QueryExecution query = rows.queryExecution();
        Task task = new Task(job, new Columns(rows.schema()));
        List<String> results = SQLExecution.withNewExecutionId(query, Option.apply(DESCRIPTION),
                () -> query.toRdd().toJavaRDD().mapPartitions(task).collect());
        return results.toArray(new String[0]);
    }

    /** The job's name in Spark's UI. */
    static final String DESCRIPTION = "kafka-eos: one transaction per source partition";

    /** One Spark task: its partition's transaction. Holds the job as its JSON text (serializable). */
    static final class Task implements FlatMapFunction<Iterator<InternalRow>, String> {
        private static final long serialVersionUID = 1L;
        private final String job;
        private final Columns at;

        Task(String job, Columns at) {
            this.job = job;
            this.at = at;
        }

        /** What Spark's plan and UI show: never the job (the client's settings, secrets among them). */
        @Override
        public String toString() {
            return DESCRIPTION;
        }

        @Override
        public Iterator<String> call(Iterator<InternalRow> input) throws Exception {
            JsonNode spec = JSON.readTree(job);
            int index = TaskContext.getPartitionId();
            JsonNode range = spec.path("tasks").get(Integer.toString(index));
            if (range == null) {
                return noRange(index, input, at).iterator();
            }
            ObjectNode result = new PartitionTransaction(spec, range, at).run(input);
            return result == null ? Collections.emptyIterator() : List.of(JSON.writeValueAsString(result)).iterator();
        }
    }

    /**
     * A task the proof gave no range (no rows when the layout was proven): rows in it belong to some
     * partition, which it must not commit: refused, so that the run fails before the driver commits
     * any range offsets-only.
     */
    static List<String> noRange(int index, Iterator<InternalRow> input, Columns at) throws Exception {
        String topic = null;
        int partition = 0;
        long rows = 0;
        while (input.hasNext()) {
            InternalRow row = input.next();
            rows++;
            String t = row.isNullAt(at.topic) ? "None" : row.getUTF8String(at.topic).toString();
            int p = row.isNullAt(at.partition) ? -1 : row.getInt(at.partition);
            if (topic == null || t.compareTo(topic) < 0 || (t.equals(topic) && p < partition)) {
                topic = t;
                partition = p;
            }
        }
        if (topic == null) {
            return Collections.emptyList();
        }
        String found = topic + "-" + partition;
        ObjectNode result = JSON.createObjectNode();
        result.put("topic", topic);
        result.put("partition", partition);
        result.put("status", PartitionTransaction.REFUSED);
        result.put("records_out", 0);
        result.put("dead_letters", 0);
        result.put("producer", "");
        result.put("refusal", "SpecError");
        result.put("reason", "rows of " + found + " in Spark task " + index + ", which the proof of the task layout gave "
                + "no source partition (the job was planned again otherwise): nothing of " + found
                + " is committed by it");
        result.put("foreign", true);
        result.put("rows", rows);
        List<String> out = new ArrayList<>();
        out.add(JSON.writeValueAsString(result));
        return out;
    }
}
