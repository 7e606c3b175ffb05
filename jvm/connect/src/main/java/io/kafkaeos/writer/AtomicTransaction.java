package io.kafkaeos.writer;

import java.io.ByteArrayOutputStream;
import java.io.DataOutputStream;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashMap;
import java.util.Iterator;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;
import java.util.UUID;
import java.util.concurrent.CancellationException;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.FutureTask;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.node.ArrayNode;
import com.fasterxml.jackson.databind.node.ObjectNode;

import org.apache.kafka.common.KafkaException;
import org.apache.kafka.common.TopicPartition;
import org.apache.spark.SparkContext;
import org.apache.spark.TaskContext;
import org.apache.spark.api.java.JavaFutureAction;
import org.apache.spark.api.java.function.FlatMapFunction;
import org.apache.spark.scheduler.SparkListener;
import org.apache.spark.scheduler.SparkListenerJobStart;
import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.catalyst.expressions.UnsafeProjection;
import org.apache.spark.sql.catalyst.expressions.UnsafeRow;
import org.apache.spark.sql.execution.QueryExecution;
import org.apache.spark.sql.execution.SQLExecution;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.unsafe.Platform;
import org.apache.spark.unsafe.types.UTF8String;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

import scala.Option;

/**
 * The atomic scope's transaction with the records produced from the driver's JVM: one Kafka
 * transaction for the whole plan under the pipeline's transactional.id, the steps of
 * {@code kafka_eos.txn} ({@link Transaction}), with the rows never reaching Python.
 *
 * <ol>
 * <li>Init under the pipeline's id, then fence each planned partition's own id (the other scope's).</li>
 * <li>The group's committed offsets, read stable: the plan's expected checkpoints go on, the ranges'
 * ends mean an earlier attempt committed (a no-op: nothing is produced), anything else is a conflict.</li>
 * <li>One Spark job of the output (one SQL execution of its query), started beside steps 1 and 2
 * ({@link SetUp}: their round trips to the brokers need not hold up the read; where they end in an
 * error or a no-op, the job is cancelled, and their outcome is the run's): each task hands its rows
 * to the driver as Spark's own binary rows, whole (a task's result comes whole or its task fails). A
 * job that fails (a read, a transform, Spark's limit on its results) fails the run before the
 * transaction opens.</li>
 * <li>Begin, and every task's rows produced in the order each source partition's rows keep (the job's
 * tasks ordered from its lineage, {@link #order}): the transaction is open only while the driver
 * produces. Each task's row count is checked as its rows are read back.</li>
 * <li>Flush, the offsets of every range, the run's manifest record and each range's checkpoint record,
 * commit.</li>
 * </ol>
 *
 * The job's results wait on the driver's heap until it ends (the Python producer took each task's
 * as it came, and spilled those out of turn to a file): the driver ({@code kafka_eos.sinks.atomic})
 * takes this route only where {@code spark.driver.maxResultSize} is well below the heap, and Spark's
 * own limit then stops a job whose output is larger; the run falls back to two passes.
 *
 * <p>Called through Py4J: {@code AtomicTransaction.commit(dataset, jobJson)}, which returns the result as
 * JSON: {@code status}, {@code records_out}, {@code dead_letters} and {@code tally} (per source
 * partition: topic, partition, results, dead letters).
 */
public final class AtomicTransaction extends Transaction {

    /** The local property of a job's tags ({@code SparkContext.SPARK_JOB_TAGS}), comma-separated. */
    static final String JOB_TAGS = "spark.job.tags";
    /** Why a job is cancelled: its set-up ended otherwise, or its caller gave it up. */
    static final String NO_USE = "the transaction will not begin (a no-op, or its set-up failed)";
    static final String GIVEN_UP = "the run's process stopped waiting for it";
    /** The job's name in Spark's UI. */
    static final String DESCRIPTION = "kafka-eos: one transaction for the whole plan";
    /** A task's rows are handed over in chunks of about this many bytes (no single array near 2 GiB). */
    static final int CHUNK_BYTES = 16 << 20;

    private static final Logger LOG = LoggerFactory.getLogger(AtomicTransaction.class);

    private final String transactionalId;
    private final JsonNode ranges;
    /** Source (topic, partition) -> {results, dead letters}: the run's counts per source partition. */
    private final Map<List<Object>, long[]> tally = new LinkedHashMap<>();

    AtomicTransaction(JsonNode job, Columns at) {
        super(job, at);
        this.transactionalId = job.get("transactional_id").asText();
        this.ranges = job.get("ranges");
    }

    /** The jobs whose caller stopped waiting for them ({@link #cancel}): they abort instead of committing. */
    private static final java.util.Set<String> CANCELLED = ConcurrentHashMap.newKeySet();

    /**
     * Give up the job {@code jobId} (its JSON's {@code job_id}): the caller's process stopped waiting for
     * it (interrupted, timed out). Its transaction then aborts where it would begin or commit next.
     */
    public static void cancel(String jobId) {
        CANCELLED.add(jobId);
        SetUp running = RUNNING.get(jobId);
        if (running != null) {
            running.stopJob(GIVEN_UP); // its rows would not be produced
        }
    }

    /** The jobs under way ({@code job_id} to their set-up): what {@link #cancel} stops. */
    private static final Map<String, SetUp> RUNNING = new ConcurrentHashMap<>();

    /** Run the whole plan's transaction over {@code rows} (the sink's prepared columns); its result as JSON. */
    public static String commit(Dataset<Row> rows, String job) throws Exception {
        JsonNode spec = PartitionCommits.JSON.readTree(job);
        return PartitionCommits.JSON.writeValueAsString(new AtomicTransaction(spec, new Columns(rows.schema())).run(rows));
    }

    @Override
    String where(String what) {
        return what + " (" + transactionalId + ", " + rangesText() + ")";
    }

    /** The plan's ranges, as kafka_eos.txn names them in its errors. */
    private String rangesText() {
        StringBuilder text = new StringBuilder();
        for (int i = 0; i < ranges.size(); i++) {
            JsonNode r = ranges.get(i);
            text.append(i > 0 ? ", " : "").append(r.get("topic").asText()).append('-').append(r.get("partition").asInt())
                    .append(" [").append(r.get("from").asLong()).append(", ").append(r.get("until").asLong()).append(')');
        }
        return text.toString();
    }

    private ObjectNode run(Dataset<Row> rows) throws Exception {
        long started = System.nanoTime();
        SetUp setUp = null;
        try {
            setUp = new SetUp(rows.sparkSession().sparkContext());
            setUp.start();
            QueryExecution query = rows.queryExecution();
            List<byte[][]> results = null;
            Throwable jobFailed = null;
            try {
                results = runJob(rows, query, setUp);
            } catch (Throwable t) {
                jobFailed = t;
            }
            long jobEnded = System.nanoTime();
            // The set-up's own outcome first, as when it came before the job: its error (a fencing, a
            // checkpoint conflict), or a no-op (an earlier attempt committed the plan: the job, cancelled
            // or done, is not produced), before the job's own error.
            if (setUp.await()) {
                return result(NOOP, 0, 0);
            }
            if (jobFailed != null || results == null) {
                notCancelled("begin_transaction"); // given up by the caller: that, not the job's cancel, is the run's end
                if (jobFailed != null) {
                    throw new Input.Failed(jobFailed); // the job's own error (a read, a transform, Spark's limit), as raised
                }
                throw new IllegalStateException("the Spark job of " + rangesText() + " did not run");
            }
            long[] counts = produceJob(results, query, rows.schema());
            long produced = System.nanoTime();
            flush();
            faults.point("before_offsets");
            Map<TopicPartition, Long> until = new LinkedHashMap<>();
            for (JsonNode r : ranges) {
                until.put(new TopicPartition(r.get("topic").asText(), r.get("partition").asInt()), r.get("until").asLong());
            }
            sendOffsets(until);
            String now = now();
            sendManifest(job.get("run_key").asText(), runRecord(counts[0], counts[1], now));
            for (JsonNode r : ranges) {
                String topic = r.get("topic").asText();
                int partition = r.get("partition").asInt();
                sendManifest(checkpointKey(topic, partition), checkpointRecord(topic, partition, r.get("until").asLong(), now));
            }
            faults.point("before_commit");
            notCancelled("commit_transaction");
            commit();
            faults.point("after_commit");
            // Where the run's time went: the job (Spark's read and transform, the rows handed to the
            // driver) with the set-up beside it, then the producing of every row, after it, in the transaction.
            timing(LOG, "kafka-eos {}: {} records, {} dead letters committed; the Spark job {} ms, and beside it "
                    + "init, fencing and checkpoint {} ms; producing {} ms, flush and commit {} ms", transactionalId,
                    counts[0], counts[1], ms(started, jobEnded), ms(started, setUp.ended), ms(begun, produced),
                    ms(produced, System.nanoTime()));
            return result(COMMITTED, counts[0], counts[1]);
        } catch (FaultPoints.TaskKilled e) {
            leaveOpen();
            throw e;
        } catch (Input.Failed e) {
            abort(); // not begun: nothing to abort; the job's own error, as it was raised
            Throwable cause = e.getCause();
            if (cause instanceof Error) {
                throw (Error) cause;
            }
            throw (Exception) cause;
        } catch (Refused refused) {
            abort();
            throw new CommitFailed(refused.refusal, refused.getMessage(), null);
        } catch (CommitFailed e) {
            throw e;
        } catch (KafkaException e) {
            throw failure("the transaction", e, true);
        } catch (Exception | Error e) {
            abort(); // the job failed (a read, a transform, Spark's limit on its results): nothing is visible
            throw e;
        } finally {
            if (setUp != null) {
                setUp.stop(); // its producer, if it made one, is the one closed here
            }
            close();
            CANCELLED.remove(job.path("job_id").asText());
        }
    }

    /**
     * Steps 1 and 2 beside the Spark job, in a thread of their own: init under the pipeline's id, the
     * fencing of the planned partitions' ids, the checkpoint check. Each is a round trip to the
     * brokers (and, in a cold driver, the Kafka client's classes loading) that the job's read need
     * not wait for: the transaction still begins only after both have ended, and only where the
     * set-up found the plan neither committed nor moved. Where it ends otherwise (an error, a no-op),
     * it cancels the job, which is then of no use.
     */
    private final class SetUp {
        private final SparkContext spark;
        /** The job's tag ({@code SparkContext.addJobTag}): what {@link #stopJob} cancels. */
        final String tag = "kafka-eos-atomic-" + UUID.randomUUID();
        private final FutureTask<Boolean> task = new FutureTask<>(() -> {
            try {
                openProducer(transactionalId);
                fence(job.get("fences"), rangesText());
                faults.point("before_check");
                return alreadyCommitted();
            } finally {
                ended = System.nanoTime();
            }
        });
        private final Thread thread = new Thread(this::runAndStopJob, "kafka-eos-atomic-setup " + transactionalId);
        /**
         * Cancels the jobs of the tag that start once the set-up has ended otherwise: those an adaptive
         * plan runs while it is planned (a shuffle's, a broadcast's stages), which the tag's cancel,
         * which meets only the jobs already started, would miss.
         */
        private final SparkListener late = new SparkListener() {
            @Override
            public void onJobStart(SparkListenerJobStart start) {
                String tags = start.properties() == null ? null : start.properties().getProperty(JOB_TAGS);
                if (tags != null && Arrays.asList(tags.split(",")).contains(tag) && stopped()) {
                    spark.cancelJob(start.jobId(), reason);
                }
            }
        };
        private volatile String reason = NO_USE;
        /** The job was told to stop ({@link #stopJob}): the set-up ended otherwise, or the caller gave the run up. */
        private volatile boolean jobStopped;
        volatile long ended = System.nanoTime();

        SetUp(SparkContext spark) {
            this.spark = spark;
            thread.setDaemon(true);
        }

        void start() {
            RUNNING.put(job.path("job_id").asText(), this);
            if (CANCELLED.contains(job.path("job_id").asText())) {
                stopJob(GIVEN_UP); // given up before it was under way
            }
            spark.addSparkListener(late);
            thread.start();
        }

        private void runAndStopJob() {
            task.run();
            if (!ready()) {
                stopJob(NO_USE);
            }
        }

        /** Whether the set-up ended, and found the transaction ready to begin (not a no-op, no error). */
        boolean ready() {
            try {
                return task.isDone() && !task.isCancelled() && !task.get();
            } catch (InterruptedException | ExecutionException e) {
                return false;
            }
        }

        /** Whether the set-up ended otherwise, or the caller gave the run up: the job would be of no use. */
        boolean stopped() {
            return jobStopped || task.isDone() && !ready();
        }

        void stopJob(String why) {
            reason = "kafka-eos: " + rangesText() + ": " + why;
            jobStopped = true;
            try {
                spark.cancelJobsWithTag(tag, reason);
            } catch (RuntimeException ignored) {
                // a stopped SparkContext: no job to cancel
            }
        }

        /**
         * The set-up's outcome, once it has ended: true where an earlier attempt committed the plan (a
         * no-op); its own error (CommitFailed: the fencing, the checkpoint) as it raised it.
         */
        boolean await() {
            try {
                return task.get();
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt(); // a killed task or operation: its kill stands
                throw new CommitFailed("TransactionFailed", where("the set-up") + ": interrupted", null);
            } catch (ExecutionException e) {
                Throwable cause = e.getCause();
                if (cause instanceof RuntimeException failed) {
                    throw failed;
                }
                if (cause instanceof Error error) {
                    throw error;
                }
                throw new IllegalStateException(cause);
            }
        }

        /**
         * Waits until the set-up's thread has ended (interrupting it where the run was given up before it
         * ended), so that the producer it made is the one {@link #close} then closes. Its calls are
         * each bounded (max.block.ms, the offsets' timeout).
         */
        void stop() {
            RUNNING.remove(job.path("job_id").asText(), this);
            try {
                spark.removeSparkListener(late);
            } catch (RuntimeException ignored) {
                // a stopped SparkContext: its bus is gone with the listener
            }
            if (!task.isDone()) {
                task.cancel(true);
            }
            boolean interrupted = false;
            while (thread.isAlive()) {
                try {
                    thread.join();
                } catch (InterruptedException e) {
                    interrupted = true;
                }
            }
            if (interrupted) {
                Thread.currentThread().interrupt();
            }
        }
    }

    /**
     * Step 3's job, beside the set-up: one SQL execution of the rows' query, as a Dataset's action is
     * (listeners, the SQL tab and OpenLineage, see it, and observations of the query are filled), each
     * task's rows handed to the driver whole; null where the job was already of no use (the set-up
     * had ended otherwise, or the caller had given the run up: nothing ran).
     */
    private List<byte[][]> runJob(Dataset<Row> rows, QueryExecution query, SetUp setUp) {
        Pack pack = new Pack(rows.schema());
        SparkContext spark = rows.sparkSession().sparkContext();
        spark.addJobTag(setUp.tag);
        try {
            return SQLExecution.withNewExecutionId(query, Option.apply(DESCRIPTION), () -> {
                if (setUp.stopped()) {
                    return null;
                }
                JavaFutureAction<List<byte[][]>> running = query.toRdd().toJavaRDD().mapPartitions(pack).collectAsync();
                if (setUp.stopped()) {
                    running.cancel(true); // it ended while the job was planned and submitted: its cancel may have come first
                }
                return awaited(running);
            });
        } finally {
            spark.removeJobTag(setUp.tag);
        }
    }

    /** The job's result, or its own error as {@code collect()} raises it (not wrapped in an ExecutionException). */
    private static <T> T awaited(JavaFutureAction<T> running) {
        try {
            return running.get();
        } catch (ExecutionException e) {
            throw AtomicTransaction.<RuntimeException>asIs(e.getCause());
        } catch (CancellationException e) {
            throw AtomicTransaction.<RuntimeException>asIs(e.getCause() != null ? e.getCause() : e);
        } catch (InterruptedException e) {
            running.cancel(true);
            Thread.currentThread().interrupt();
            throw AtomicTransaction.<RuntimeException>asIs(e);
        }
    }

    /** {@code t} thrown as it is, checked or not (a lambda that Scala calls cannot declare it). */
    @SuppressWarnings("unchecked")
    private static <E extends Throwable> E asIs(Throwable t) throws E {
        throw (E) t;
    }

    /** Fails where the caller gave this job up ({@link #cancel}). */
    private void notCancelled(String what) {
        if (CANCELLED.contains(job.path("job_id").asText())) {
            abort();
            throw new CommitFailed("TransactionFailed", where(what) + ": cancelled, the run's process stopped "
                    + "waiting for it; nothing of it is committed", null);
        }
    }

    /** Step 2, as kafka_eos.txn reads it: true when an earlier attempt committed the plan. */
    private boolean alreadyCommitted() {
        List<TopicPartition> tps = new ArrayList<>();
        for (JsonNode r : ranges) {
            tps.add(new TopicPartition(r.get("topic").asText(), r.get("partition").asInt()));
        }
        Map<TopicPartition, org.apache.kafka.clients.consumer.OffsetAndMetadata> found =
                tps.isEmpty() ? Map.of() : committed(tps, "kafka-eos-check-" + transactionalId);
        // Refresh ranges (idle partitions, checkpoints committed again unchanged) cannot tell a landed
        // commit from a pending one; the ranges that move decide, when there are any.
        boolean deciding = false;
        boolean allAtEnd = true;
        for (int i = 0; i < tps.size(); i++) {
            JsonNode r = ranges.get(i);
            Long expected = r.get("expected").isNull() ? null : r.get("expected").asLong();
            long until = r.get("until").asLong();
            if (expected == null || expected != until) {
                deciding = true;
                Long committed = offsetOf(found, tps.get(i));
                allAtEnd = allAtEnd && committed != null && committed == until;
            }
        }
        if (deciding && allAtEnd) {
            return true;
        }
        for (int i = 0; i < tps.size(); i++) {
            JsonNode r = ranges.get(i);
            Long expected = r.get("expected").isNull() ? null : r.get("expected").asLong();
            Long committed = offsetOf(found, tps.get(i));
            checkUnmoved(tps.get(i).topic() + "-" + tps.get(i).partition(), committed, expected, r.get("until").asLong());
        }
        return false;
    }

    /** Step 3, after the job: every task's rows produced in their order; {results, dead letters}. */
    private long[] produceJob(List<byte[][]> results, QueryExecution query, StructType schema) throws Refused {
        Map<Integer, byte[][]> byTask = new HashMap<>();
        for (byte[][] p : results) {
            if (byTask.put(taskOf(p), p) != null) {
                throw new IllegalStateException("two results of Spark task " + taskOf(p) + " of one job");
            }
        }
        if (byTask.size() != query.toRdd().getNumPartitions()) {
            throw new IllegalStateException("the job gave " + byTask.size() + " tasks' results of "
                    + query.toRdd().getNumPartitions());
        }
        // The transaction opens now, with the job done: it is open only while the driver produces, so a
        // long Spark job cannot outlast the transaction timeout (the fencing and the check above still
        // came first: an attempt that starts later fences this producer, whose commit then fails).
        notCancelled("begin_transaction");
        producer.beginTransaction();
        begun = System.nanoTime();
        long[] counts = {0, 0};
        UnsafeRow row = new UnsafeRow(schema.size());
        UTF8String lastTopic = null;
        String topic = null;
        for (int task : order(query)) {
            byte[][] p = byTask.remove(task);
            long expected = rowsOf(p);
            long seen = 0;
            for (int c = 1; c < p.length; c++) {
                byte[] chunk = p[c];
                p[c] = null; // produced: no longer held
                int pos = 0;
                while (pos < chunk.length) {
                    int size = ((chunk[pos] & 0xff) << 24) | ((chunk[pos + 1] & 0xff) << 16)
                            | ((chunk[pos + 2] & 0xff) << 8) | (chunk[pos + 3] & 0xff);
                    row.pointTo(chunk, Platform.BYTE_ARRAY_OFFSET + pos + 4, size);
                    pos += 4 + size;
                    seen++;
                    if (row.isNullAt(at.topic)) {
                        topic = null;
                        lastTopic = null;
                    } else if (lastTopic == null || !lastTopic.equals(row.getUTF8String(at.topic))) {
                        lastTopic = row.getUTF8String(at.topic).clone();
                        topic = lastTopic.toString();
                    }
                    Integer partition = row.isNullAt(at.partition) ? null : row.getInt(at.partition);
                    boolean isDead = produceRow(row, topic, partition);
                    if (topic != null && partition != null) {
                        tally.computeIfAbsent(List.of(topic, partition), k -> new long[2])[isDead ? 1 : 0]++;
                    }
                    counted(isDead, counts);
                }
            }
            if (seen != expected) { // a task's rows are handed over whole, or the run fails here
                throw new IllegalStateException("Spark task " + task + " packed " + expected + " rows, " + seen
                        + " were read back");
            }
        }
        if (!byTask.isEmpty()) { // every task's rows were produced, or nothing commits
            throw new IllegalStateException("Spark tasks " + byTask.keySet() + " of the job were not produced");
        }
        return counts;
    }

    /**
     * The tasks in the order their rows are produced: where the lineage proves what each task reads
     * ({@link ReadLayout}), in the order of their ranges (the tasks reading one source partition in the
     * order of their offsets, as kafka-eos's {@code batches.turns} orders them); else in their own order
     * (a shuffle: each key is in one task; a union or a coalesce: one group in the tasks' order).
     */
    private static List<Integer> order(QueryExecution query) {
        int tasks = query.toRdd().getNumPartitions();
        List<Integer> order = new ArrayList<>();
        List<Row> layout = ReadLayout.layout(query.toRdd());
        if (layout.size() == tasks) {
            List<Row> sorted = new ArrayList<>(layout);
            sorted.sort(java.util.Comparator.<Row, String>comparing(r -> r.getString(1))
                    .thenComparingInt(r -> r.getInt(2)).thenComparingLong(r -> r.getLong(3)));
            sorted.forEach(r -> order.add(r.getInt(0)));
        } else {
            for (int i = 0; i < tasks; i++) {
                order.add(i);
            }
        }
        return order;
    }

    /** A task's result: its index and row count first (a 12-byte header), then its rows' chunks. */
    private static int taskOf(byte[][] result) {
        return java.nio.ByteBuffer.wrap(result[0]).getInt(0);
    }

    private static long rowsOf(byte[][] result) {
        return java.nio.ByteBuffer.wrap(result[0]).getLong(4);
    }

    /** The run's manifest record: the driver's summary of the run, and what this transaction committed. */
    private Map<String, Object> runRecord(long out, long dead, String committedAt) {
        @SuppressWarnings("unchecked")
        Map<String, Object> record = PartitionCommits.JSON.convertValue(job.get("summary"), TreeMap.class);
        return committedRecord(record, out, dead, committedAt);
    }

    private ObjectNode result(String status, long out, long dead) {
        ObjectNode result = PartitionCommits.JSON.createObjectNode();
        result.put("status", status);
        result.put("records_out", out);
        result.put("dead_letters", dead);
        ArrayNode counts = result.putArray("tally");
        tally.forEach((tp, n) -> counts.addArray().add((String) tp.get(0)).add((Integer) tp.get(1)).add(n[0]).add(n[1]));
        return result;
    }

    /**
     * A Spark task of the job: its rows packed for the driver, whole (one result per task): a header
     * (the task's index, 4 bytes, and its row count, 8), then chunks of Spark's own binary rows, each a
     * 4-byte length and the row. Plain byte arrays, which every serializer of task results takes (a
     * Kryo that requires registration too).
     */
    static final class Pack implements FlatMapFunction<Iterator<InternalRow>, byte[][]> {
        private static final long serialVersionUID = 1L;
        private final StructType schema;

        Pack(StructType schema) {
            this.schema = schema;
        }

        /** What Spark's plan and UI show. */
        @Override
        public String toString() {
            return DESCRIPTION;
        }

        @Override
        public Iterator<byte[][]> call(Iterator<InternalRow> input) throws Exception {
            UnsafeProjection unsafe = null;
            List<byte[]> chunks = new ArrayList<>();
            chunks.add(null); // the header, below
            ByteArrayOutputStream bytes = new ByteArrayOutputStream(1 << 16);
            DataOutputStream out = new DataOutputStream(bytes);
            byte[] buffer = new byte[4096];
            long rows = 0;
            while (input.hasNext()) {
                InternalRow next = input.next();
                UnsafeRow row;
                if (next instanceof UnsafeRow) {
                    row = (UnsafeRow) next;
                } else {
                    if (unsafe == null) {
                        unsafe = UnsafeProjection.create(schema);
                    }
                    row = unsafe.apply(next);
                }
                out.writeInt(row.getSizeInBytes());
                row.writeToStream(out, buffer);
                rows++;
                if (bytes.size() >= CHUNK_BYTES) {
                    out.flush();
                    chunks.add(bytes.toByteArray());
                    bytes.reset();
                }
            }
            out.flush();
            if (bytes.size() > 0) {
                chunks.add(bytes.toByteArray());
            }
            chunks.set(0, java.nio.ByteBuffer.allocate(12).putInt(TaskContext.getPartitionId()).putLong(rows).array());
            return List.<byte[][]>of(chunks.toArray(new byte[0][])).iterator();
        }
    }
}
