package io.kafkaeos.writer;

import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.util.List;
import java.util.Locale;

import org.apache.kafka.common.compress.Lz4BlockOutputStream;
import org.apache.kafka.common.header.Header;

/**
 * A record the sink refuses for its own sake, measured before it is produced, as
 * {@code kafka_eos.sinks.limits} measures it in Python: larger than the producer's limit (librdkafka's
 * {@code message.max.bytes}, the same for every kafka-eos producer of the pipeline), or larger, compressed
 * as the producer compresses it (lz4), than its topic's {@code max.message.bytes}.
 */
final class RecordLimits {

    /** A record's overhead in Kafka's v2 format, as librdkafka adds it (kafka_eos.sinks.limits). */
    static final int RECORD_OVERHEAD = 36;
    /** A record batch's own header in the v2 format. */
    static final int BATCH_OVERHEAD = 61;

    private RecordLimits() {
    }

    /** Why the sink would refuse the record, or null: {@code {size, reason}}. */
    static Object[] refusedBecause(byte[] key, byte[] value, List<Header> headers, long producerMax, long topicMax) {
        long size = size(key, value, headers);
        if (size > producerMax) {
            return new Object[] {size, "more than the producer's message.max.bytes " + grouped(producerMax)};
        }
        if (topicMax > 0 && size + BATCH_OVERHEAD > topicMax) {
            long batch = BATCH_OVERHEAD + RECORD_OVERHEAD + compressed(key, value, headers);
            if (batch > topicMax) {
                return new Object[] {size, grouped(batch) + " bytes compressed, more than the topic's max.message.bytes "
                        + grouped(topicMax)};
            }
        }
        return null;
    }

    /** A record's size as librdkafka's produce() measures it against message.max.bytes. */
    static long size(byte[] key, byte[] value, List<Header> headers) {
        long size = RECORD_OVERHEAD + length(key) + length(value);
        for (Header h : headers) {
            int name = h.key().getBytes(StandardCharsets.UTF_8).length;
            int data = length(h.value());
            size += varintLength(name) + name + varintLength(data) + data;
        }
        return size;
    }

    static String grouped(long n) {
        return String.format(Locale.ROOT, "%,d", n);
    }

    private static int length(byte[] b) {
        return b == null ? 0 : b.length;
    }

    private static int varintLength(long n) {
        n <<= 1;
        int length = 1;
        while (n >= 0x80) {
            n >>= 7;
            length++;
        }
        return length;
    }

    private static long compressed(byte[] key, byte[] value, List<Header> headers) {
        ByteArrayOutputStream out = new ByteArrayOutputStream();
        try (Lz4BlockOutputStream lz4 = new Lz4BlockOutputStream(out, Lz4BlockOutputStream.BLOCKSIZE_64KB, false)) {
            if (key != null) {
                lz4.write(key, 0, key.length);
            }
            if (value != null) {
                lz4.write(value, 0, value.length);
            }
            for (Header h : headers) {
                byte[] name = h.key().getBytes(StandardCharsets.UTF_8);
                lz4.write(name, 0, name.length);
                if (h.value() != null) {
                    lz4.write(h.value(), 0, h.value().length);
                }
            }
        } catch (IOException e) {
            throw new IllegalStateException("lz4: " + e, e);
        }
        return out.size();
    }
}
