package io.kafkaeos.writer;

import java.util.Iterator;
import java.util.Map;
import java.util.Set;
import java.util.TreeMap;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.node.ObjectNode;

import org.apache.kafka.common.KafkaException;
import org.apache.kafka.common.TopicPartition;
import org.apache.spark.sql.catalyst.InternalRow;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

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
final class PartitionTransaction extends Transaction {

    static final String REFUSED = "refused";

    private static final Logger LOG = LoggerFactory.getLogger(PartitionTransaction.class);

    private final String topic;
    private final int partition;
    private final long from;
    private final long until;
    private final Long expected;
    private final String transactionalId;
    /** Rows this task took from Spark's iterator (its result's {@code rows}). */
    private long read;

    PartitionTransaction(JsonNode job, JsonNode range, Columns at) {
        super(job, at);
        this.topic = range.get("topic").asText();
        this.partition = range.get("partition").asInt();
        this.from = range.get("from").asLong();
        this.until = range.get("until").asLong();
        this.expected = range.get("expected").isNull() ? null : range.get("expected").asLong();
        this.transactionalId = range.get("transactional_id").asText();
    }

    @Override
    String where(String what) {
        return what + " (" + transactionalId + ", " + topic + "-" + partition + " [" + from + ", " + until + "))";
    }

    /** The transaction of this task's rows; null where no row came (the driver commits the range offsets-only). */
    ObjectNode run(Iterator<InternalRow> spark) throws Exception {
        Input rows = new Input(spark);
        long started = System.nanoTime();
        try {
            openProducer(transactionalId);
            long opened = System.nanoTime();
            fence(job.get("fences"), topic + "-" + partition + " [" + from + ", " + until + ")");
            long fenced = System.nanoTime();
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
            long produced = System.nanoTime();
            flush();
            faults.point("before_offsets");
            sendOffsets(Map.of(new TopicPartition(topic, partition), until));
            String now = now();
            sendManifest(job.get("pipeline").asText() + ":" + job.get("run_id").asText() + ":" + topic + "-" + partition,
                    partitionRecord(counts[0], counts[1], now));
            sendManifest(checkpointKey(topic, partition), checkpointRecord(topic, partition, until, now));
            faults.point("before_commit");
            commit();
            faults.point("after_commit");
            // Where a task's time went (a line per task, as Spark's own task lines): the set-up is paid
            // per task, the rows' part is Spark's read and transform with the producing.
            timing(LOG, "kafka-eos {}-{} [{}, {}): {} records, {} dead letters committed; init {} ms, fencing {} ms, "
                    + "checkpoint {} ms, rows {} ms, flush and commit {} ms", topic, partition, from, until, counts[0],
                    counts[1], ms(started, opened), ms(opened, fenced), ms(fenced, begun), ms(begun, produced),
                    ms(produced, System.nanoTime()));
            return result(COMMITTED, counts[0], counts[1], null, null, false);
        } catch (FaultPoints.TaskKilled e) {
            leaveOpen();
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

    /** Step 2: true when an earlier attempt committed the range. */
    private boolean alreadyCommitted() {
        TopicPartition tp = new TopicPartition(topic, partition);
        Long committed = offsetOf(committed(Set.of(tp), "kafka-eos-check-" + transactionalId), tp);
        if ((expected == null || expected != until) && committed != null && committed == until) {
            return true;
        }
        checkUnmoved(topic + "-" + partition, committed, expected, until);
        return false;
    }

    /** Step 3: every row produced; {results, dead letters}, or null where the input had no row. */
    private long[] produceRows(Iterator<InternalRow> rows) throws Refused {
        long[] counts = {0, 0};
        boolean seen = false;
        while (rows.hasNext()) {
            InternalRow row = rows.next();
            read++;
            seen = true;
            String foreign = foreignPartition(row);
            if (foreign != null) {
                throw new Refused("_Refused", relabelled(foreign), true);
            }
            counted(produceRow(row, topic, partition), counts);
        }
        return seen ? counts : null;
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

    /** The manifest's record of the partition's part of the run, written inside its transaction. */
    private Map<String, Object> partitionRecord(long out, long dead, String committedAt) {
        Map<String, Object> record = committedRecord(new TreeMap<>(), out, dead, committedAt);
        record.put("from", from);
        record.put("until", until);
        return record;
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
