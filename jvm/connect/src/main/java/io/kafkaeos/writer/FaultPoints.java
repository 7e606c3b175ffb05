package io.kafkaeos.writer;

import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.FileAlreadyExistsException;
import java.nio.file.Files;
import java.nio.file.NoSuchFileException;
import java.nio.file.Path;
import java.util.Arrays;
import java.util.HashMap;
import java.util.Map;

/**
 * The commit path's named points ({@code after_produce}, {@code before_offsets}, {@code before_commit},
 * {@code after_commit}; the atomic set-up's {@code before_check}, beside its Spark job) where the
 * repository's fault tests act, as {@code kafka_eos_lab.faults} does in Python: the settings come with
 * the job (the run's {@code KAFKA_EOS_CRASH_AT}, {@code KAFKA_EOS_CRASH_ONCE}, {@code KAFKA_EOS_PAUSE_AT},
 * {@code KAFKA_EOS_PAUSE_DIR}); a deployment's job carries none, and every point is then one test of an
 * empty map.
 *
 * <p>A crash SIGKILLs this JVM: the executor (in local mode, the driver with it), as a lost host would.
 * In a Spark Connect server's own JVM (local mode: the server is the executor) it kills the task
 * instead ({@link TaskKilled}): its transaction is left open, as a killed task leaves it, and the
 * server that every session shares lives on, as it does when a Python commit task's worker is killed.
 */
final class FaultPoints {

    /** The longest a paused task waits for its go: a test that died must not leave it hanging. */
    private static final long PAUSE_LIMIT_MS = 600_000L;

    /** Passes per point, in this JVM (the n-th pass of {@code KAFKA_EOS_CRASH_AT=point:n} crashes). */
    private static final Map<String, Integer> SEEN = new HashMap<>();

    private final Map<String, String> settings;

    /** The main class of a Spark Connect server (its JVM's command names it). */
    private static final String CONNECT_SERVER = "org.apache.spark.sql.connect.service.SparkConnectServer";

    /** A crash point's kill of the task alone: its transaction is left as it is (neither aborted nor closed). */
    static final class TaskKilled extends Error {
        private static final long serialVersionUID = 1L;

        TaskKilled(String point) {
            super("kafka-eos fault point " + point + ": the task killed (KAFKA_EOS_CRASH_AT)");
        }
    }

    /** The settings' names, as the environment names them (kafka_eos_lab.faults.SETTINGS). */
    private static final String[] NAMES = {"KAFKA_EOS_CRASH_AT", "KAFKA_EOS_CRASH_KILL", "KAFKA_EOS_CRASH_ONCE",
        "KAFKA_EOS_PAUSE_AT", "KAFKA_EOS_PAUSE_DIR"};

    /**
     * @param settings the run's, carried by the job; none given, this JVM's own environment's where it
     *     names the probe ({@code KAFKA_EOS_PROBES}, as a Python process installs it: a cluster's workers
     *     hand their settings to their executors), else none.
     */
    FaultPoints(Map<String, String> settings) {
        Map<String, String> own = new HashMap<>();
        if (settings.isEmpty() && System.getenv("KAFKA_EOS_PROBES") != null && !System.getenv("KAFKA_EOS_PROBES").isEmpty()) {
            for (String name : NAMES) {
                String value = System.getenv(name);
                if (value != null && !value.isEmpty()) {
                    own.put(name, value);
                }
            }
        }
        this.settings = settings.isEmpty() ? own : settings;
    }

    private String crashPoint() {
        String spec = settings.getOrDefault("KAFKA_EOS_CRASH_AT", "");
        int colon = spec.indexOf(':');
        return colon < 0 ? spec : spec.substring(0, colon);
    }

    private int crashAfter() {
        String spec = settings.getOrDefault("KAFKA_EOS_CRASH_AT", "");
        int colon = spec.indexOf(':');
        return colon < 0 ? 1 : Integer.parseInt(spec.substring(colon + 1));
    }

    private boolean pausesAt(String point) {
        return Arrays.asList(settings.getOrDefault("KAFKA_EOS_PAUSE_AT", "").split(",")).contains(point);
    }

    /** Whether a crash or a pause waits at {@code point} (a loop asks before it pays for one). */
    boolean armed(String point) {
        return !settings.isEmpty() && (point.equals(crashPoint()) || pausesAt(point));
    }

    /** Pause here, or SIGKILL this JVM, when the job's settings ask for it (tests only). */
    void point(String point) {
        if (settings.isEmpty()) {
            return;
        }
        if (pausesAt(point)) {
            pause(point);
        }
        if (!point.equals(crashPoint())) {
            return;
        }
        int seen;
        synchronized (SEEN) {
            seen = SEEN.merge(point, 1, Integer::sum);
        }
        if (seen < crashAfter()) {
            return;
        }
        long pid = ProcessHandle.current().pid();
        boolean server = System.getProperty("sun.java.command", "").contains(CONNECT_SERVER);
        String once = settings.get("KAFKA_EOS_CRASH_ONCE");
        if (once != null && !once.isEmpty()) {
            try {
                Files.write(Path.of(once), (point + " pid=" + pid + (server ? " task of the Spark Connect server\n"
                                : " jvm\n")).getBytes(StandardCharsets.UTF_8),
                        java.nio.file.StandardOpenOption.CREATE_NEW, java.nio.file.StandardOpenOption.WRITE);
            } catch (FileAlreadyExistsException e) {
                return; // an earlier process crashed here already
            } catch (IOException e) {
                throw new IllegalStateException("KAFKA_EOS_CRASH_ONCE=" + once + ": " + e, e);
            }
        }
        if (server) {
            throw new TaskKilled(point);
        }
        try {
            new ProcessBuilder("kill", "-KILL", Long.toString(pid)).inheritIO().start().waitFor();
            Thread.sleep(10_000L); // the signal ends this JVM before
        } catch (IOException | InterruptedException e) {
            // halted below
        }
        Runtime.getRuntime().halt(137); // never on to the commit
    }

    private void pause(String point) {
        Path folder = Path.of(settings.getOrDefault("KAFKA_EOS_PAUSE_DIR", "."));
        try {
            Files.write(folder.resolve(point + ".reached"),
                    (ProcessHandle.current().pid() + "\n").getBytes(StandardCharsets.UTF_8),
                    java.nio.file.StandardOpenOption.CREATE_NEW, java.nio.file.StandardOpenOption.WRITE);
        } catch (FileAlreadyExistsException | NoSuchFileException e) {
            return; // paused here already, or not armed now (no folder)
        } catch (IOException e) {
            throw new IllegalStateException("KAFKA_EOS_PAUSE_DIR=" + folder + ": " + e, e);
        }
        long deadline = System.currentTimeMillis() + PAUSE_LIMIT_MS;
        while (!Files.exists(folder.resolve(point + ".go")) && System.currentTimeMillis() < deadline) {
            try {
                Thread.sleep(50L);
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
                return;
            }
        }
    }
}
