package io.kafkaeos.oauth;

import java.io.IOException;
import java.io.OutputStream;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.Collections;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.TimeUnit;

import javax.security.auth.callback.Callback;
import javax.security.auth.callback.UnsupportedCallbackException;
import javax.security.auth.login.AppConfigurationEntry;

import org.apache.kafka.common.security.auth.AuthenticateCallbackHandler;
import org.apache.kafka.common.security.auth.SaslExtensions;
import org.apache.kafka.common.security.auth.SaslExtensionsCallback;
import org.apache.kafka.common.security.oauthbearer.OAuthBearerToken;
import org.apache.kafka.common.security.oauthbearer.OAuthBearerTokenCallback;

/**
 * The Java client's OAUTHBEARER login through a Python token callback: the same callable the
 * confluent-kafka clients call as {@code oauth_cb} (an Airflow Kafka connection's allowlisted
 * {@code oauth_cb}, Amazon MSK IAM's signer), so that Spark's Kafka connector logs in as the
 * pipeline's Python clients do. Each login (Kafka's {@code LoginManager} shares one per JAAS
 * configuration in a JVM and refreshes it before the token expires) runs
 * {@code <python> -m kafka_eos.oauth <callback>} with {@code sasl.oauthbearer.config}'s text on its
 * standard input (never on the command line: it may hold a secret); the answer is the token, its
 * expiry in epoch milliseconds, the principal and any SASL extensions ({@code key=value}), one
 * per line.
 *
 * <p>Options of the {@code OAuthBearerLoginModule} JAAS entry: {@code callback} (the callable's
 * dotted path, required), {@code python} (the interpreter with kafka-eos installed; default
 * {@code python3}), {@code config} (the callback's argument; default empty).
 *
 * <p>Set with {@code sasl.login.callback.handler.class=io.kafkaeos.oauth.PythonTokenLoginCallbackHandler}.
 */
public final class PythonTokenLoginCallbackHandler implements AuthenticateCallbackHandler {

    /** A callback that does not answer in this time fails the login (Kafka retries it). */
    static final long TIMEOUT_S = 60;
    /** An answer longer than this is no token's (a callback that printed to its standard output). */
    static final long MAX_ANSWER_BYTES = 1 << 20;

    private String python = "python3";
    private String callback;
    private String config = "";
    private Map<String, String> extensions = Collections.emptyMap();

    @Override
    public void configure(Map<String, ?> configs, String saslMechanism, List<AppConfigurationEntry> jaasConfigEntries) {
        if (!"OAUTHBEARER".equals(saslMechanism)) {
            throw new IllegalArgumentException("PythonTokenLoginCallbackHandler serves OAUTHBEARER, not " + saslMechanism);
        }
        if (jaasConfigEntries.size() != 1) {
            throw new IllegalArgumentException("PythonTokenLoginCallbackHandler needs one JAAS entry, got " + jaasConfigEntries.size());
        }
        Map<String, ?> options = jaasConfigEntries.get(0).getOptions();
        callback = (String) options.get("callback");
        if (callback == null || callback.isEmpty()) {
            throw new IllegalArgumentException("PythonTokenLoginCallbackHandler: the JAAS entry has no callback option");
        }
        if (options.get("python") != null) {
            python = (String) options.get("python");
        }
        if (options.get("config") != null) {
            config = (String) options.get("config");
        }
    }

    @Override
    public void handle(Callback[] callbacks) throws IOException, UnsupportedCallbackException {
        for (Callback cb : callbacks) {
            if (cb instanceof OAuthBearerTokenCallback) {
                ((OAuthBearerTokenCallback) cb).token(fetch());
            } else if (cb instanceof SaslExtensionsCallback) {
                ((SaslExtensionsCallback) cb).extensions(new SaslExtensions(extensions));
            } else {
                throw new UnsupportedCallbackException(cb);
            }
        }
    }

    private OAuthBearerToken fetch() throws IOException {
        // The answer goes to a file of its own, read once the process has ended: a callback that
        // hangs (or leaves a child holding a pipe) is killed at the timeout, never waited on forever.
        Path answer = Files.createTempFile("kafka-eos-token", ".txt");
        try {
            Process process = new ProcessBuilder(python, "-m", "kafka_eos.oauth", callback)
                .redirectOutput(answer.toFile())
                .redirectError(ProcessBuilder.Redirect.INHERIT).start();
            try (OutputStream in = process.getOutputStream()) {
                in.write(config.getBytes(StandardCharsets.UTF_8));
            }
            try {
                if (!process.waitFor(TIMEOUT_S, TimeUnit.SECONDS)) {
                    kill(process);
                    throw new IOException("token callback " + callback + " did not answer in " + TIMEOUT_S + " s");
                }
            } catch (InterruptedException e) {
                kill(process);
                Thread.currentThread().interrupt();
                throw new IOException("interrupted waiting for token callback " + callback, e);
            }
            List<String> lines = Files.size(answer) > MAX_ANSWER_BYTES ? List.of()
                : Files.readAllLines(answer, StandardCharsets.UTF_8);
            if (process.exitValue() != 0 || lines.size() < 3) {
                throw new IOException("token callback " + callback + " failed (exit " + process.exitValue()
                    + "; " + python + " -m kafka_eos.oauth printed its error above)");
            }
            Map<String, String> ext = new HashMap<>();
            for (String line : lines.subList(3, lines.size())) {
                int eq = line.indexOf('=');
                if (eq > 0) {
                    ext.put(line.substring(0, eq), line.substring(eq + 1));
                }
            }
            long expiresAtMs;
            try {
                expiresAtMs = Long.parseLong(lines.get(1).trim());
            } catch (NumberFormatException e) {
                throw new IOException("token callback " + callback + ": its expiry is not a number", e);
            }
            extensions = ext;
            return new Token(lines.get(0), expiresAtMs, lines.get(2), System.currentTimeMillis());
        } finally {
            Files.deleteIfExists(answer);
        }
    }

    private static void kill(Process process) {
        process.descendants().forEach(ProcessHandle::destroyForcibly);
        process.destroyForcibly();
    }

    @Override
    public void close() {
    }

    /** A token as the callback gave it: its value is not parsed (an MSK IAM token is no JWT). */
    private static final class Token implements OAuthBearerToken {
        private final String value;
        private final long lifetimeMs;
        private final String principal;
        private final long startMs;

        Token(String value, long lifetimeMs, String principal, long startMs) {
            this.value = value;
            this.lifetimeMs = lifetimeMs;
            this.principal = principal;
            this.startMs = startMs;
        }

        @Override
        public String value() {
            return value;
        }

        @Override
        public Set<String> scope() {
            return Collections.emptySet();
        }

        @Override
        public long lifetimeMs() {
            return lifetimeMs;
        }

        @Override
        public String principalName() {
            return principal;
        }

        @Override
        public Long startTimeMs() {
            return startMs;
        }

        @Override
        public String toString() {  // never the token itself
            return "OAuthBearerToken(principal=" + principal + ", lifetimeMs=" + lifetimeMs + ")";
        }
    }
}
