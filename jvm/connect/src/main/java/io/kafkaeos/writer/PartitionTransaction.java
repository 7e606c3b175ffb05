package io.kafkaeos.writer;

import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.time.OffsetDateTime;
import java.time.ZoneOffset;
import java.time.format.DateTimeFormatter;
import java.util.ArrayList;
import java.util.Base64;
import java.util.Iterator;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.TreeMap;
import java.util.Set;
import java.util.concurrent.atomic.AtomicReference;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.node.ObjectNode;

import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerGroupMetadata;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.KafkaException;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.errors.AuthenticationException;
import org.apache.kafka.common.errors.AuthorizationException;
import org.apache.kafka.common.errors.InvalidProducerEpochException;
import org.apache.kafka.common.errors.ProducerFencedException;
import org.apache.kafka.common.errors.UnsupportedVersionException;
import org.apache.kafka.common.header.Header;
import org.apache.kafka.common.header.internals.RecordHeader;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.apache.kafka.common.serialization.ByteArraySerializer;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.catalyst.util.ArrayData;

/**
 * One source partition's transaction, the steps of {@code kafka_eos.txn} (docs/architecture.md,
 * "Commit protocol"):
 *
 * <ol>
 * <li>{@code initTransactions()} under the partition's own transactional.id: older attempts of the
 * same work are fenced and their open transaction aborted; then the ids of the other commit scope
 * ({@code fences}), with throwaway producers.</li>
 * <li>The group's committed offset, read stable: the plan's expected checkpoint goes on; the range's
 * end means an earlier attempt committed (no-op); anything else is a conflict.</li>
 * <li>Produce every row (results to the sink topic, dead letters to the dead-letter topic with the
 * reason and source coordinates in headers), flush, send the offsets into the transaction, the
 * manifest's partition and checkpoint records, commit.</li>
 * </ol>
 *
 * A row of another source partition, a dead letter with no dead-letter topic, or a record the sink
 * refuses with {@code on_refused_record: fail} aborts the transaction and is reported as a refusal
 * (the driver fails the run with it). Any other failure aborts the transaction (unless it is the
 * commit's own, whose outcome is then unknown: the next attempt's init settles it) and fails the
 * task with the kafka-eos error's class and one line, as the Python task's error reads:
 * {@code kafka_eos.errors.<Class>: <message>}.
 */
final class PartitionTransaction {

    static final String COMMITTED = "committed";
    static final String NOOP = "noop";
    static final String REFUSED = "refused";
    /** Timeout of one blocking call (init, offsets, commit), as kafka_eos.txn's CALL_TIMEOUT_S. */
    static final long CALL_TIMEOUT_MS = 60_000L;
    /** The dead-letter headers' names, in order: the last four headers of every dead letter (kafka_eos.wire). */
    static final String[] DEAD_LETTER_HEADERS = {"kafka-eos.reason", "kafka-eos.source.topic",
        "kafka-eos.source.partition", "kafka-eos.source.offset"};
    /**
     * The producers' {@code retry.backoff.ms} where the client's settings give none. The Java client's
     * sender sleeps it before every transactional request it had to send again after finding the
     * coordinator, which each new producer does for its init (and the fencing producer for its own) and
     * for its first {@code send_offsets_to_transaction}: at the default of 100 ms, 0.3 s of every
     * task (measured: a warm task's init and fencing 230–370 ms, its offsets 110 ms; with 10 ms, 45–90
     * ms and 15–18 ms). Failed produce requests back off from it exponentially, up to
     * {@code retry.backoff.max.ms} (1 s), as before.
     */
    static final String COORDINATOR_BACKOFF_MS = "10";
    /** The Java producer's batch.size at most (below the topics' limits, as kafka_eos.sinks.limits bounds it). */
    static final long JAVA_BATCH_BYTES = 256 * 1024;
    /** A refused record's key is kept in its reference dead letter up to this size (kafka_eos.sinks.limits). */
    static final int KEPT_KEY_BYTES = 1024;
    private static final DateTimeFormatter ISO = DateTimeFormatter.ofPattern("yyyy-MM-dd'T'HH:mm:ss.SSSSSSxxx");

    private final JsonNode job;
    private final String topic;
    private final int partition;
    private final long from;
    private final long until;
    private final Long expected;
    private final String transactionalId;
    private final String sinkTopic;
    private final String dlqTopic;
    private final List<Header> added = new ArrayList<>();
    private final FaultPoints faults;
    private final Columns at;
    private final AtomicReference<Exception> deliveryError = new AtomicReference<>();
    /** Where the first failed delivery was going ({@code topic-partition}). */
    private final AtomicReference<String> deliveryTo = new AtomicReference<>();
    private KafkaProducer<byte[], byte[]> producer;
    private long begun = -1L;
    /** Rows this task took from Spark's iterator (its result's {@code rows}). */
    private long read;

    /** Thrown inside the row loop: the rows break the scope's rules (the transaction aborts). */
    static final class Refused extends Exception {
        private static final long serialVersionUID = 1L;
        final String refusal;
        final boolean foreign;

        Refused(String refusal, String reason, boolean foreign) {
            super(reason, null, false, false);
            this.refusal = refusal;
            this.foreign = foreign;
        }
    }

    /** A kafka-eos error of the task, read by the driver from its text. */
    static final class CommitFailed extends RuntimeException {
        private static final long serialVersionUID = 1L;

        CommitFailed(String kind, String message, Throwable cause) {
            super("kafka_eos.errors." + kind + ": " + message, cause);
        }
    }

    PartitionTransaction(JsonNode job, JsonNode range, Columns at) {
        this.job = job;
        this.at = at;
        this.topic = range.get("topic").asText();
        this.partition = range.get("partition").asInt();
        this.from = range.get("from").asLong();
        this.until = range.get("until").asLong();
        this.expected = range.get("expected").isNull() ? null : range.get("expected").asLong();
        this.transactionalId = range.get("transactional_id").asText();
        this.sinkTopic = job.get("sink_topic").asText();
        this.dlqTopic = job.get("dlq_topic").isNull() ? null : job.get("dlq_topic").asText();
        for (JsonNode h : job.get("headers")) {
            added.add(new RecordHeader(h.get(0).asText(), Base64.getDecoder().decode(h.get(1).asText())));
        }
        Map<String, String> probes = new TreeMap<>();
        job.path("probes").fields().forEachRemaining(e -> probes.put(e.getKey(), e.getValue().asText()));
        this.faults = new FaultPoints(probes);
    }

    private String where(String what) {
        return what + " (" + transactionalId + ", " + topic + "-" + partition + " [" + from + ", " + until + "))";
    }

    /** The transaction of this task's rows; null where no row came (the driver commits the range offsets-only). */
    ObjectNode run(Iterator<InternalRow> spark) throws Exception {
        Input rows = new Input(spark);
        try {
            open();
            if (alreadyCommitted()) {
                // An earlier attempt committed the range: its rows are read all the same (Spark's count
                // of them checks it), and each must still be this partition's, as when it commits.
                boolean any = false;
                while (rows.hasNext()) {
                    InternalRow row = rows.next();
                    read++;
                    any = true;
                    String foreign = foreignPartition(row);
                    if (foreign != null) {
                        foreignIn(rows);
                        return result(REFUSED, 0, 0, "_Refused", relabelled(foreign), true);
                    }
                }
                return any ? result(NOOP, 0, 0, null, null, false) : null;
            }
            producer.beginTransaction();
            begun = System.nanoTime();
            long[] counts;
            try {
                counts = produceRows(rows);
            } catch (Refused refused) {
                abort();
                boolean foreign = refused.foreign || foreignIn(rows);
                return result(REFUSED, 0, 0, refused.refusal, refused.getMessage(), foreign);
            }
            if (counts == null) {
                abort(); // no rows: nothing to commit here
                return null;
            }
            flush();
            faults.point("before_offsets");
            sendOffsets();
            for (Map.Entry<String, Map<String, Object>> m : manifest(counts[0], counts[1]).entrySet()) {
                send(job.get("manifest_topic").asText(), m.getKey().getBytes(StandardCharsets.UTF_8),
                        PartitionCommits.JSON.writeValueAsBytes(m.getValue()), List.of());
            }
            faults.point("before_commit");
            commit();
            faults.point("after_commit");
            return result(COMMITTED, counts[0], counts[1], null, null, false);
        } catch (FaultPoints.TaskKilled e) {
            // Left as a killed task leaves it: its transaction open until the next attempt fences it. A
            // forced close (no wait) sends no EndTxn, and frees the producer's thread and buffers.
            producer.close(Duration.ZERO);
            producer = null;
            throw e;
        } catch (Input.Failed e) {
            abort(); // the read or the transform failed: nothing of the range is visible; its own error, as it is
            Throwable cause = e.getCause();
            if (cause instanceof Error) {
                throw (Error) cause;
            }
            throw (Exception) cause;
        } catch (CommitFailed e) {
            throw e;
        } catch (KafkaException e) {
            throw failure("the transaction", e, true);
        } catch (Exception | Error e) {
            abort(); // the input failed (the read, the transform): nothing of it is visible
            throw e;
        } finally {
            close();
        }
    }

    private Properties clientProps() {
        Properties props = new Properties();
        job.get("client").fields().forEachRemaining(e -> props.put(e.getKey(), e.getValue().asText()));
        return props;
    }

    /** Step 1: fence older attempts (own id, then the other scope's ids). */
    private void open() {
        Properties props = clientProps();
        props.put(ProducerConfig.TRANSACTIONAL_ID_CONFIG, transactionalId);
        props.put(ProducerConfig.ENABLE_IDEMPOTENCE_CONFIG, "true");
        props.put(ProducerConfig.ACKS_CONFIG, "all");
        props.put(ProducerConfig.TRANSACTION_TIMEOUT_CONFIG, job.get("timeout_ms").asText());
        props.put(ProducerConfig.LINGER_MS_CONFIG, "20");
        props.put(ProducerConfig.COMPRESSION_TYPE_CONFIG, "lz4");
        // librdkafka's batch.size is a bound in native memory; the Java client reserves it from its
        // buffer pool (32 MB) for each open partition batch: a wide sink would exhaust the pool.
        props.put(ProducerConfig.BATCH_SIZE_CONFIG, Long.toString(Math.min(job.get("batch_bytes").asLong(),
                JAVA_BATCH_BYTES)));
        // Records up to the producer's limit as kafka-eos measures it (RecordLimits) pass the Java
        // client's own estimate (which counts a batch header) too.
        props.put(ProducerConfig.MAX_REQUEST_SIZE_CONFIG,
                Long.toString(Math.max(job.get("producer_max").asLong(), job.get("batch_bytes").asLong()) + 4096));
        props.put(ProducerConfig.MAX_BLOCK_MS_CONFIG, Long.toString(CALL_TIMEOUT_MS));
        props.put(ProducerConfig.CLIENT_ID_CONFIG, "kafka-eos-" + transactionalId);
        props.putIfAbsent(ProducerConfig.RETRY_BACKOFF_MS_CONFIG, COORDINATOR_BACKOFF_MS);
        try {
            producer = new KafkaProducer<>(props, new ByteArraySerializer(), new ByteArraySerializer());
            retried(producer::initTransactions);
        } catch (KafkaException e) {
            throw failure("init_transactions", e, false);
        }
        for (JsonNode id : job.get("fences")) {
            Properties fence = clientProps();
            fence.put(ProducerConfig.TRANSACTIONAL_ID_CONFIG, id.asText());
            fence.put(ProducerConfig.TRANSACTION_TIMEOUT_CONFIG, job.get("timeout_ms").asText());
            fence.put(ProducerConfig.MAX_BLOCK_MS_CONFIG, Long.toString(CALL_TIMEOUT_MS));
            fence.putIfAbsent(ProducerConfig.RETRY_BACKOFF_MS_CONFIG, COORDINATOR_BACKOFF_MS);
            try (KafkaProducer<byte[], byte[]> fencer = new KafkaProducer<>(fence, new ByteArraySerializer(),
                    new ByteArraySerializer())) {
                fencer.initTransactions();
            } catch (KafkaException e) {
                throw new CommitFailed("TransactionFailed", "fencing " + id.asText() + " before committing " + topic + "-"
                        + partition + " [" + from + ", " + until + "): " + e.getClass().getSimpleName() + ": "
                        + e.getMessage(), null);
            }
        }
    }

    /** Step 2: true when an earlier attempt committed the range. */
    private boolean alreadyCommitted() throws Exception {
        String group = job.get("group_id").asText();
        TopicPartition tp = new TopicPartition(topic, partition);
        Map<TopicPartition, OffsetAndMetadata> found;
        // A consumer that never joins the group: it asks for stable offsets (as every Java consumer
        // does) and waits out a transaction's offsets still pending (UNSTABLE_OFFSET_COMMIT), where an
        // Admin client would leave the partition out of its answer, as if it had no offset.
        Properties props = clientProps();
        props.put(ConsumerConfig.GROUP_ID_CONFIG, group);
        props.put(ConsumerConfig.ISOLATION_LEVEL_CONFIG, "read_committed");
        props.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
        props.put(ConsumerConfig.CLIENT_ID_CONFIG, "kafka-eos-check-" + transactionalId);
        try (KafkaConsumer<byte[], byte[]> reader = new KafkaConsumer<>(props, new ByteArrayDeserializer(),
                new ByteArrayDeserializer())) {
            found = reader.committed(Set.of(tp), Duration.ofMillis(CALL_TIMEOUT_MS));
        } catch (KafkaException e) {
            throw new CommitFailed("BrokerError", "committed offsets of group " + quoted(group) + ": "
                    + e.getClass().getSimpleName() + ": " + e.getMessage(), null);
        }
        OffsetAndMetadata at = found == null ? null : found.get(tp);
        Long committed = at == null ? null : at.offset();
        if ((expected == null || expected != until) && committed != null && committed == until) {
            return true;
        }
        if (committed == null && expected != null) {
            throw new CommitFailed("CheckpointLost", topic + "-" + partition + ": group " + quoted(group) + " has no "
                    + "committed offset any more, the plan expected " + expected + ": the broker expired it "
                    + "(offsets.retention.minutes) or the group was deleted after the plan was made; nothing was written",
                    null);
        }
        if (committed == null ? expected != null : !committed.equals(expected)) {
            throw new CommitFailed("CheckpointConflict", topic + "-" + partition + ": group " + quoted(group) + " is at "
                    + (committed == null ? "None" : committed) + ", the plan expected "
                    + (expected == null ? "None" : expected) + " (ends at " + until + "): a concurrent or stale plan",
                    null);
        }
        return false;
    }

    /** {@code text} as Python's repr quotes it (the messages of kafka_eos.txn). */
    private static String quoted(String text) {
        if (text.contains("'") && !text.contains("\"")) {
            return "\"" + text.replace("\\", "\\\\") + "\"";
        }
        return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'";
    }

    /** Step 3: every row produced; {results, dead letters}, or null where the input had no row. */
    private long[] produceRows(Iterator<InternalRow> rows) throws Refused {
        long out = 0;
        long dead = 0;
        boolean seen = false;
        JsonNode limits = job.get("limits");
        boolean failOnRefused = "fail".equals(job.get("on_refused_record").asText());
        while (rows.hasNext()) {
            InternalRow row = rows.next();
            read++;
            seen = true;
            String foreign = foreignPartition(row);
            if (foreign != null) {
                throw new Refused("_Refused", relabelled(foreign), true);
            }
            long offset = row.getLong(at.offset);
            byte[] key = row.isNullAt(at.key) ? null : row.getBinary(at.key);
            byte[] value = row.isNullAt(at.value) ? null : row.getBinary(at.value);
            String reason = row.isNullAt(at.reason) ? null : row.getUTF8String(at.reason).toString();
            List<Header> headers = new ArrayList<>();
            if (at.headers >= 0 && !row.isNullAt(at.headers)) {
                ArrayData carried = row.getArray(at.headers);
                for (int i = 0; i < carried.numElements(); i++) {
                    InternalRow header = carried.getStruct(i, 2);
                    headers.add(new RecordHeader(header.getUTF8String(at.headerKey).toString(),
                            header.isNullAt(at.headerValue) ? null : header.getBinary(at.headerValue)));
                }
            }
            headers.addAll(added);
            if (reason != null) {
                headers.addAll(deadLetterHeaders(reason, offset));
            }
            String to = reason == null ? sinkTopic : dlqTopic;
            if (to != null && limits.has(to)) {
                Object[] why = RecordLimits.refusedBecause(key, value, headers, limits.get(to).get(0).asLong(),
                        limits.get(to).get(1).asLong());
                if (why != null) {
                    String what = topic + "-" + partition + " offset " + offset + ": its "
                            + (reason != null ? "dead letter" : "record") + " for topic " + to + " is "
                            + RecordLimits.grouped((Long) why[0]) + " bytes, " + why[1];
                    if (failOnRefused) {
                        throw new Refused("RecordRefused", what + "; sink.on_refused_record: fail (its transaction was "
                                + "aborted)", false);
                    }
                    if (dlqTopic == null) {
                        throw new Refused("DeadLetterWithoutTopic", what + ", and " + job.get("spec_path").asText()
                                + " has no sink.dlq_topic for a dead letter: its transaction was aborted; set "
                                + "sink.dlq_topic, or raise the limit", false);
                    }
                    reason = "refused by the sink: " + what + (reason != null ? "; dead-lettered first for: " + reason : "");
                    key = key != null && key.length <= KEPT_KEY_BYTES ? key : null;
                    // As kafka_eos.sinks.limits writes it (json.dumps: its order, separators and escapes).
                    value = ("{\"refused\": " + PythonJson.string(what) + ", \"source\": {\"topic\": "
                            + PythonJson.string(topic) + ", \"partition\": " + partition + ", \"offset\": " + offset
                            + "}, \"size\": " + why[0] + "}").getBytes(StandardCharsets.UTF_8);
                    headers = new ArrayList<>(added);
                    headers.addAll(deadLetterHeaders(reason, offset));
                    to = dlqTopic;
                }
            }
            if (reason != null && dlqTopic == null) {
                throw new Refused("DeadLetterWithoutTopic", topic + "-" + partition + " offset " + offset + ": dead letter ("
                        + reason + ") but " + job.get("spec_path").asText() + " has no sink.dlq_topic: its transaction "
                        + "was aborted; set sink.dlq_topic or fix the record", false);
            }
            send(to, key, value, headers);
            if (to.equals(dlqTopic) && isDeadLetter(headers)) {
                dead++;
            } else {
                out++;
            }
            if (out + dead == 100 && faults.armed("after_produce")) {
                flush(); // part of the output is on the broker
                faults.point("after_produce");
            }
        }
        return seen ? new long[] {out, dead} : null;
    }

    /** The rest of a refused task's input, read for Spark's count of it: true where a row names another partition. */
    private boolean foreignIn(Iterator<InternalRow> rows) {
        boolean foreign = false;
        while (rows.hasNext()) {
            InternalRow row = rows.next();
            read++;
            foreign = foreign || foreignPartition(row) != null;
        }
        return foreign;
    }

    /** The source partition {@code row} names where it is not this task's ({@code topic-partition}, a null as
     * {@code None}), else null. */
    private String foreignPartition(InternalRow row) {
        String rowTopic = row.isNullAt(at.topic) ? null : row.getUTF8String(at.topic).toString();
        Integer rowPartition = row.isNullAt(at.partition) ? null : row.getInt(at.partition);
        if (topic.equals(rowTopic) && rowPartition != null && rowPartition == partition) {
            return null;
        }
        return (rowTopic == null ? "None" : rowTopic) + "-" + (rowPartition == null ? "None" : rowPartition);
    }

    private String relabelled(String found) {
        return job.get("spec_path").asText() + ": transform: " + job.get("transform").asText() + " puts rows of "
                + found + " in the Spark task of " + topic + "-" + partition + "; per_partition scope needs a row-wise "
                + "transform that keeps topic and partition: use commit: atomic";
    }

    private List<Header> deadLetterHeaders(String reason, long offset) {
        String[] values = {reason, topic, Integer.toString(partition), Long.toString(offset)};
        List<Header> headers = new ArrayList<>();
        for (int i = 0; i < DEAD_LETTER_HEADERS.length; i++) {
            headers.add(new RecordHeader(DEAD_LETTER_HEADERS[i], values[i].getBytes(StandardCharsets.UTF_8)));
        }
        return headers;
    }

    private static boolean isDeadLetter(List<Header> headers) {
        int n = headers.size();
        if (n < DEAD_LETTER_HEADERS.length) {
            return false;
        }
        for (int i = 0; i < DEAD_LETTER_HEADERS.length; i++) {
            if (!DEAD_LETTER_HEADERS[i].equals(headers.get(n - DEAD_LETTER_HEADERS.length + i).key())) {
                return false;
            }
        }
        return true;
    }

    private void send(String to, byte[] key, byte[] value, List<Header> headers) {
        Exception failed = deliveryError.get();
        if (failed != null) {
            throw failure("delivery to " + deliveryTo.get(), failed, true);
        }
        producer.send(new ProducerRecord<>(to, null, key, value, headers), (metadata, error) -> {
            if (error != null && deliveryError.compareAndSet(null, error)) {
                deliveryTo.set(metadata == null ? to : metadata.topic() + "-" + metadata.partition());
            }
        });
    }

    private void flush() {
        producer.flush();
        Exception failed = deliveryError.get();
        if (failed != null) {
            throw failure("delivery to " + deliveryTo.get(), failed, true);
        }
    }

    /** Step 3b: the consumed offset (the range's end), with the commit time in its metadata. */
    private void sendOffsets() {
        // Ended by a NUL, as librdkafka writes it: confluent-kafka reads the metadata it fetches as a C
        // string, and one without the NUL reads on into whatever follows it (kafka-eos's plans read it).
        String metadata = "kafka-eos committed_at=" + System.currentTimeMillis()
                + (job.path("planned_ms").isNull() || job.path("planned_ms").isMissingNode() ? ""
                        : " planned_at=" + job.get("planned_ms").asLong()) + "\u0000";
        try {
            retried(() -> producer.sendOffsetsToTransaction(Map.of(new TopicPartition(topic, partition),
                    new OffsetAndMetadata(until, metadata)), new ConsumerGroupMetadata(job.get("group_id").asText())));
        } catch (KafkaException e) {
            throw failure("send_offsets_to_transaction", e, true);
        }
    }

    private void commit() {
        try {
            retried(producer::commitTransaction);
        } catch (ProducerFencedException | InvalidProducerEpochException e) {
            throw failure("commit_transaction", e, false);
        } catch (KafkaException e) {
            // The commit may have reached the coordinator: not aborted. The next attempt's
            // init_transactions() settles it, and its checkpoint check sees which way it went.
            throw new CommitFailed("TransactionFailed", where("commit_transaction") + ": outcome unknown after "
                    + e.getClass().getSimpleName() + ": " + e.getMessage() + "; a retry of the same plan settles it", e);
        }
    }

    /** How often a retriable error of one call (a timeout) is retried before the attempt fails (kafka_eos.txn). */
    static final int MAX_CALL_RETRIES = 5;

    /** {@code call}, retried where its wait ran out (the Java client lets init, offsets and commit be called
     * again after a timeout), with kafka_eos.txn's backoff. */
    private static void retried(Runnable call) {
        for (int attempt = 0; ; attempt++) {
            try {
                call.run();
                return;
            } catch (org.apache.kafka.common.errors.TimeoutException e) {
                // Only the call's own wait that ran out: the client lets it be called again, and the retry
                // waits on the same request. Any other error is the transaction's, reported as it is.
                if (attempt >= MAX_CALL_RETRIES) {
                    throw e;
                }
                try {
                    Thread.sleep(Math.min(100L << attempt, 2000L));
                } catch (InterruptedException interrupted) {
                    Thread.currentThread().interrupt();
                    throw e;
                }
            }
        }
    }

    /** The manifest's records, written inside the transaction: the partition's, then its checkpoint's. */
    private Map<String, Map<String, Object>> manifest(long out, long dead) {
        String now = OffsetDateTime.now(ZoneOffset.UTC).format(ISO);
        String pipeline = job.get("pipeline").asText();
        String runId = job.get("run_id").asText();
        Map<String, Object> record = new TreeMap<>();
        record.put("status", COMMITTED);
        record.put("records_out", out);
        record.put("dead_letters", dead);
        record.put("records_in", out + dead);
        record.put("committed_at", now);
        record.put("read", "whole");
        record.put("from", from);
        record.put("until", until);
        Map<String, Object> checkpoint = new TreeMap<>();
        checkpoint.put("checkpoint", true);
        checkpoint.put("group_id", job.get("group_id").asText());
        checkpoint.put("topic", topic);
        checkpoint.put("partition", partition);
        checkpoint.put("offset", until);
        checkpoint.put("run_id", runId);
        checkpoint.put("committed_at", now);
        Map<String, Map<String, Object>> records = new java.util.LinkedHashMap<>();
        records.put(pipeline + ":" + runId + ":" + topic + "-" + partition, record);
        records.put(job.get("spec_name").asText() + ":checkpoint:" + topic + "-" + partition, checkpoint);
        return records;
    }

    /** The error to fail the task with for {@code e}, after aborting where that is the right move. */
    private CommitFailed failure(String what, Exception e, boolean abortFirst) {
        String at = where(what);
        String name = e.getClass().getSimpleName();
        if (e instanceof ProducerFencedException || e instanceof InvalidProducerEpochException) {
            long openMs = begun < 0 ? 0 : (System.nanoTime() - begun) / 1_000_000L;
            long timeoutMs = job.get("timeout_ms").asLong();
            if (begun >= 0 && openMs >= timeoutMs) {
                return new CommitFailed("TransactionTimedOut", at + ": aborted by the transaction coordinator after the "
                        + "transaction timeout of " + PythonJson.number(timeoutMs / 1000.0) + "s (open " + Math.round(openMs / 1000.0)
                        + "s here); the Java "
                        + "client reports it as " + name + ". Nothing of it is visible; raise sink.transaction_timeout_s "
                        + "(up to the brokers' transaction.max.timeout.ms) or lower source.max_records_per_run", e);
            }
            return new CommitFailed("ProducerFenced", at + ": fenced by a newer attempt of the same work: " + name + ": "
                    + e.getMessage(), e);
        }
        if (e instanceof AuthorizationException || e instanceof AuthenticationException
                || e instanceof UnsupportedVersionException) {
            return new CommitFailed("TransactionFailed", at + ": fatal " + name + ": " + e.getMessage(), e);
        }
        if (abortFirst) {
            abort();
        }
        return new CommitFailed("TransactionFailed", at + ": aborted after " + name + ": " + e.getMessage(), e);
    }

    private void abort() {
        if (producer == null || begun < 0) {
            return;
        }
        try {
            producer.abortTransaction();
        } catch (KafkaException ignored) {
            // the next init_transactions() of this transactional.id aborts it anyway
        }
        begun = -1L;
    }

    private void close() {
        if (producer != null) {
            try {
                producer.close(Duration.ofSeconds(5));
            } catch (KafkaException ignored) {
                // closed as far as it goes
            }
            producer = null;
        }
    }

    private ObjectNode result(String status, long out, long dead, String refusal, String reason, boolean foreign) {
        ObjectNode result = PartitionCommits.JSON.createObjectNode();
        result.put("topic", topic);
        result.put("partition", partition);
        result.put("status", status);
        result.put("records_out", out);
        result.put("dead_letters", dead);
        result.put("producer", "built");
        if (refusal == null) {
            result.putNull("refusal");
            result.putNull("reason");
        } else {
            result.put("refusal", refusal);
            result.put("reason", reason);
        }
        result.put("foreign", foreign);
        result.put("rows", read);
        return result;
    }
}
