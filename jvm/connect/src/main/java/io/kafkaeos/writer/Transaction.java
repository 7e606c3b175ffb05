package io.kafkaeos.writer;

import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.time.OffsetDateTime;
import java.time.ZoneOffset;
import java.time.format.DateTimeFormatter;
import java.util.ArrayList;
import java.util.Base64;
import java.util.Collection;
import java.util.List;
import java.util.Map;
import java.util.Objects;
import java.util.Properties;
import java.util.TreeMap;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.ExecutorCompletionService;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicReference;

import com.fasterxml.jackson.databind.JsonNode;

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
import org.slf4j.Logger;

/**
 * What both commit scopes' transactions share, the steps of {@code kafka_eos.txn} (docs/architecture.md,
 * "Commit protocol"): the producer under a transactional.id and its init, the fencing of the other
 * scope's ids, the group's committed offsets read stable, each row produced as the sink writes it (its
 * headers, dead-letter headers and record limits), the offsets with kafka-eos's metadata, the manifest's
 * records, the commit, and the errors as the driver reads them: {@code kafka_eos.errors.<Class>: <line>}.
 *
 * <p>{@link PartitionTransaction}: one source partition's, in its Spark task. {@link AtomicTransaction}:
 * the whole plan's, in the driver.
 */
abstract class Transaction {

    static final String COMMITTED = "committed";
    static final String NOOP = "noop";
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
    /** How often a retriable error of one call (a timeout) is retried before the attempt fails (kafka_eos.txn). */
    static final int MAX_CALL_RETRIES = 5;
    private static final DateTimeFormatter ISO = DateTimeFormatter.ofPattern("yyyy-MM-dd'T'HH:mm:ss.SSSSSSxxx");

    final JsonNode job;
    final Columns at;
    final FaultPoints faults;
    final String sinkTopic;
    final String dlqTopic;
    private final List<Header> added = new ArrayList<>();
    private final JsonNode limits;
    private final boolean failOnRefused;
    private final AtomicReference<Exception> deliveryError = new AtomicReference<>();
    /** Where the first failed delivery was going ({@code topic-partition}). */
    private final AtomicReference<String> deliveryTo = new AtomicReference<>();
    KafkaProducer<byte[], byte[]> producer;
    long begun = -1L;

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

    /** A kafka-eos error of the transaction, read by the driver from its text. */
    static final class CommitFailed extends RuntimeException {
        private static final long serialVersionUID = 1L;

        CommitFailed(String kind, String message, Throwable cause) {
            super("kafka_eos.errors." + kind + ": " + message, cause);
        }
    }

    Transaction(JsonNode job, Columns at) {
        this.job = job;
        this.at = at;
        this.sinkTopic = job.get("sink_topic").asText();
        this.dlqTopic = job.get("dlq_topic").isNull() ? null : job.get("dlq_topic").asText();
        for (JsonNode h : job.get("headers")) {
            added.add(new RecordHeader(h.get(0).asText(), Base64.getDecoder().decode(h.get(1).asText())));
        }
        this.limits = job.get("limits");
        this.failOnRefused = "fail".equals(job.get("on_refused_record").asText());
        Map<String, String> probes = new TreeMap<>();
        job.path("probes").fields().forEachRemaining(e -> probes.put(e.getKey(), e.getValue().asText()));
        this.faults = new FaultPoints(probes);
    }

    /** {@code what} with the transactional.id and the ranges, for an error's text. */
    abstract String where(String what);

    Properties clientProps() {
        Properties props = new Properties();
        job.get("client").fields().forEachRemaining(e -> props.put(e.getKey(), e.getValue().asText()));
        return props;
    }

    /** Step 1: the producer under {@code transactionalId}, its init fencing older attempts of the same work. */
    void openProducer(String transactionalId) {
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
    }

    /** Milliseconds from one {@code System.nanoTime()} to another. */
    static long ms(long from, long to) {
        return (to - from) / 1_000_000L;
    }

    /** A transaction's timing line, after its commit: a logger that fails must not make a committed transaction a failed task. */
    static void timing(Logger log, String format, Object... values) {
        try {
            log.info(format, values);
        } catch (Throwable ignored) {
            // the commit stands
        }
    }

    /** The most fencing producers started at once (an atomic run fences each planned partition's id). */
    static final int FENCING_THREADS = 8;

    /**
     * Step 1b: the other scope's ids for the same partitions, with throwaway producers. Several ids are
     * fenced at once (each init is a round trip to its coordinator, and in a cold JVM the client's
     * start). It returns only once every id's init has returned; at the first failure the ids not yet
     * begun are left (the commit fails: nothing is produced), the ones at work are interrupted, and that
     * failure is raised.
     */
    void fence(Iterable<JsonNode> ids, String committing) {
        List<String> names = new ArrayList<>();
        for (JsonNode id : ids) {
            names.add(id.asText());
        }
        if (names.size() <= 1) {
            for (String name : names) {
                fenceOne(name, committing);
            }
            return;
        }
        AtomicInteger threads = new AtomicInteger();
        ExecutorService pool = Executors.newFixedThreadPool(Math.min(names.size(), FENCING_THREADS), task -> {
            Thread thread = new Thread(task, "kafka-eos-fencing-" + threads.incrementAndGet());
            thread.setDaemon(true);
            return thread;
        });
        ExecutorCompletionService<String> done = new ExecutorCompletionService<>(pool);
        for (String name : names) {
            done.submit(() -> {
                fenceOne(name, committing);
                return name;
            });
        }
        int pending = names.size();
        Throwable first = null;
        try {
            while (pending > 0) {
                Future<String> one = done.take();
                pending--;
                try {
                    one.get();
                } catch (ExecutionException e) {
                    if (first == null) {
                        first = e.getCause();
                        pending -= pool.shutdownNow().size(); // never begun: nothing of theirs to wait for
                    }
                }
            }
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt(); // a killed task: its kill stands
            throw new CommitFailed("TransactionFailed", "fencing before committing " + committing + ": interrupted",
                    null);
        } finally {
            pool.shutdownNow();
        }
        if (first instanceof RuntimeException failed) {
            throw failed; // CommitFailed, as fenceOne raises it
        }
        if (first instanceof Error error) {
            throw error;
        }
        if (first != null) {
            throw new IllegalStateException(first);
        }
    }

    private void fenceOne(String id, String committing) {
        Properties fence = clientProps();
        fence.put(ProducerConfig.TRANSACTIONAL_ID_CONFIG, id);
        fence.put(ProducerConfig.TRANSACTION_TIMEOUT_CONFIG, job.get("timeout_ms").asText());
        fence.put(ProducerConfig.MAX_BLOCK_MS_CONFIG, Long.toString(CALL_TIMEOUT_MS));
        fence.putIfAbsent(ProducerConfig.RETRY_BACKOFF_MS_CONFIG, COORDINATOR_BACKOFF_MS);
        try (KafkaProducer<byte[], byte[]> fencer = new KafkaProducer<>(fence, new ByteArraySerializer(),
                new ByteArraySerializer())) {
            fencer.initTransactions();
        } catch (KafkaException e) {
            throw new CommitFailed("TransactionFailed", "fencing " + id + " before committing " + committing
                    + ": " + e.getClass().getSimpleName() + ": " + e.getMessage(), null);
        }
    }

    /** Step 2: the group's committed offsets of {@code tps}, read stable (a partition without one is absent). */
    Map<TopicPartition, OffsetAndMetadata> committed(Collection<TopicPartition> tps, String clientId) {
        String group = job.get("group_id").asText();
        // A consumer that never joins the group: it asks for stable offsets (as every Java consumer
        // does) and waits out a transaction's offsets still pending (UNSTABLE_OFFSET_COMMIT), where an
        // Admin client would leave the partition out of its answer, as if it had no offset.
        Properties props = clientProps();
        props.put(ConsumerConfig.GROUP_ID_CONFIG, group);
        props.put(ConsumerConfig.ISOLATION_LEVEL_CONFIG, "read_committed");
        props.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
        props.put(ConsumerConfig.CLIENT_ID_CONFIG, clientId);
        try (KafkaConsumer<byte[], byte[]> reader = new KafkaConsumer<>(props, new ByteArrayDeserializer(),
                new ByteArrayDeserializer())) {
            Map<TopicPartition, OffsetAndMetadata> found = reader.committed(new java.util.HashSet<>(tps),
                    Duration.ofMillis(CALL_TIMEOUT_MS));
            return found == null ? Map.of() : found;
        } catch (KafkaException e) {
            throw new CommitFailed("BrokerError", "committed offsets of group " + quoted(group) + ": "
                    + e.getClass().getSimpleName() + ": " + e.getMessage(), null);
        }
    }

    /** The offset of {@code tp} in {@code found}, or null. */
    static Long offsetOf(Map<TopicPartition, OffsetAndMetadata> found, TopicPartition tp) {
        OffsetAndMetadata at = found.get(tp);
        return at == null ? null : at.offset();
    }

    /**
     * Step 2: the group's committed offset of a range where it is not the plan's: its checkpoint gone
     * ({@code CheckpointLost}), or moved by another plan ({@code CheckpointConflict}).
     *
     * @param name the range's {@code topic-partition}
     * @param committed the group's offset now (null: none), {@code expected} the plan's, {@code until} the range's end
     */
    void checkUnmoved(String name, Long committed, Long expected, long until) {
        String group = job.get("group_id").asText();
        if (committed == null && expected != null) {
            throw new CommitFailed("CheckpointLost", name + ": group " + quoted(group) + " has no committed offset "
                    + "any more, the plan expected " + expected + ": the broker expired it (offsets.retention.minutes) "
                    + "or the group was deleted after the plan was made; nothing was written", null);
        }
        if (!Objects.equals(committed, expected)) {
            throw new CommitFailed("CheckpointConflict", name + ": group " + quoted(group) + " is at "
                    + (committed == null ? "None" : committed) + ", the plan expected "
                    + (expected == null ? "None" : expected) + " (ends at " + until + "): a concurrent or stale plan",
                    null);
        }
    }

    /** {@code text} as Python's repr quotes it (the messages of kafka_eos.txn). */
    static String quoted(String text) {
        if (text.contains("'") && !text.contains("\"")) {
            return "\"" + text.replace("\\", "\\\\") + "\"";
        }
        return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'";
    }

    /**
     * Step 3, one row: its record to the sink topic, or its dead letter to the dead-letter topic, with the
     * transform's headers, the sink's, and a dead letter's reason and source coordinates; a record the sink
     * refuses for its size as a reference dead letter (or refused, with {@code on_refused_record: fail}).
     *
     * @param source the row's source topic (null: Python's {@code None})
     * @param sourcePartition the row's source partition, likewise
     * @return true where it was a dead letter
     */
    boolean produceRow(InternalRow row, String source, Integer sourcePartition) throws Refused {
        String topic = source == null ? "None" : source;
        String partition = sourcePartition == null ? "None" : sourcePartition.toString();
        Long sourceOffset = row.isNullAt(at.offset) ? null : row.getLong(at.offset);
        String offset = sourceOffset == null ? "None" : sourceOffset.toString();
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
            headers.addAll(deadLetterHeaders(reason, topic, partition, offset));
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
                        + (source == null ? "null" : PythonJson.string(source))
                        + ", \"partition\": " + (sourcePartition == null ? "null" : partition)
                        + ", \"offset\": " + (sourceOffset == null ? "null" : offset)
                        + "}, \"size\": " + why[0] + "}").getBytes(StandardCharsets.UTF_8);
                headers = new ArrayList<>(added);
                headers.addAll(deadLetterHeaders(reason, topic, partition, offset));
                to = dlqTopic;
            }
        }
        if (reason != null && dlqTopic == null) {
            throw new Refused("DeadLetterWithoutTopic", topic + "-" + partition + " offset " + offset + ": dead letter ("
                    + reason + ") but " + job.get("spec_path").asText() + " has no sink.dlq_topic: its transaction "
                    + "was aborted; set sink.dlq_topic or fix the record", false);
        }
        send(to, key, value, headers);
        return to.equals(dlqTopic) && isDeadLetter(headers);
    }

    /** A produced row counted in {@code counts} ({results, dead letters}); at the 100th, the fault point
     * {@code after_produce}, with part of the output on the broker. */
    void counted(boolean dead, long[] counts) {
        counts[dead ? 1 : 0]++;
        if (counts[0] + counts[1] == 100 && faults.armed("after_produce")) {
            flush();
            faults.point("after_produce");
        }
    }

    private static List<Header> deadLetterHeaders(String reason, String topic, String partition, String offset) {
        String[] values = {reason, topic, partition, offset};
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

    void send(String to, byte[] key, byte[] value, List<Header> headers) {
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

    /** A manifest record, as JSON, inside the transaction. */
    void sendManifest(String key, Object record) throws Exception {
        send(job.get("manifest_topic").asText(), key.getBytes(StandardCharsets.UTF_8),
                PartitionCommits.JSON.writeValueAsBytes(record), List.of());
    }

    void flush() {
        producer.flush();
        Exception failed = deliveryError.get();
        if (failed != null) {
            throw failure("delivery to " + deliveryTo.get(), failed, true);
        }
    }

    /** Step 3b: the consumed offsets (each range's end), with the commit time in their metadata. */
    void sendOffsets(Map<TopicPartition, Long> until) {
        // Ended by a NUL, as librdkafka writes it: confluent-kafka reads the metadata it fetches as a C
        // string, and one without the NUL reads on into whatever follows it (kafka-eos's plans read it).
        String metadata = "kafka-eos committed_at=" + System.currentTimeMillis()
                + (job.path("planned_ms").isNull() || job.path("planned_ms").isMissingNode() ? ""
                        : " planned_at=" + job.get("planned_ms").asLong()) + "\u0000";
        Map<TopicPartition, OffsetAndMetadata> offsets = new java.util.LinkedHashMap<>();
        until.forEach((tp, offset) -> offsets.put(tp, new OffsetAndMetadata(offset, metadata)));
        try {
            retried(() -> producer.sendOffsetsToTransaction(offsets,
                    new ConsumerGroupMetadata(job.get("group_id").asText())));
        } catch (KafkaException e) {
            throw failure("send_offsets_to_transaction", e, true);
        }
    }

    void commit() {
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

    /** {@code call}, retried where its wait ran out (the Java client lets init, offsets and commit be called
     * again after a timeout), with kafka_eos.txn's backoff. */
    static void retried(Runnable call) {
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

    /** Now, as kafka-eos's manifest writes its times. */
    static String now() {
        return OffsetDateTime.now(ZoneOffset.UTC).format(ISO);
    }

    /** {@code record} with the fields of a manifest record written inside the transaction that committed its
     * work (kafka_eos.sinks.kafka.committed_record). */
    static Map<String, Object> committedRecord(Map<String, Object> record, long out, long dead, String committedAt) {
        record.put("status", COMMITTED);
        record.put("records_out", out);
        record.put("dead_letters", dead);
        record.put("records_in", out + dead);
        record.put("committed_at", committedAt);
        record.put("read", "whole");
        return record;
    }

    /** The manifest's checkpoint record of one range, written inside the transaction that commits it. */
    Map<String, Object> checkpointRecord(String topic, int partition, long until, String committedAt) {
        Map<String, Object> checkpoint = new TreeMap<>();
        checkpoint.put("checkpoint", true);
        checkpoint.put("group_id", job.get("group_id").asText());
        checkpoint.put("topic", topic);
        checkpoint.put("partition", partition);
        checkpoint.put("offset", until);
        checkpoint.put("run_id", job.get("run_id").asText());
        checkpoint.put("committed_at", committedAt);
        return checkpoint;
    }

    /** The manifest key of one range's checkpoint record. */
    String checkpointKey(String topic, int partition) {
        return job.get("spec_name").asText() + ":checkpoint:" + topic + "-" + partition;
    }

    /** The error to fail with for {@code e}, after aborting where that is the right move. */
    CommitFailed failure(String what, Exception e, boolean abortFirst) {
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

    void abort() {
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

    /** A killed transaction left as a killed process leaves it: open until the next attempt fences it. A
     * forced close (no wait) sends no EndTxn, and frees the producer's thread and buffers. */
    void leaveOpen() {
        if (producer != null) {
            producer.close(Duration.ZERO);
            producer = null;
        }
    }

    void close() {
        if (producer != null) {
            try {
                producer.close(Duration.ofSeconds(5));
            } catch (KafkaException ignored) {
                // closed as far as it goes
            }
            producer = null;
        }
    }
}
