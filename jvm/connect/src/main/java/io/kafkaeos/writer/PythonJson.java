package io.kafkaeos.writer;

import java.math.BigDecimal;

/** Values written as Python's {@code json.dumps} and {@code format(x, "g")} write them, where the Python
 * writer's bytes are the contract (a reference dead letter's value; an error's text). */
final class PythonJson {

    private PythonJson() {
    }

    /** {@code text} as a JSON string, escaped as json.dumps escapes it (ensure_ascii). */
    static String string(String text) {
        StringBuilder out = new StringBuilder("\"");
        for (int i = 0; i < text.length(); i++) {
            char c = text.charAt(i);
            switch (c) {
                case '"': out.append("\\\""); break;
                case '\\': out.append("\\\\"); break;
                case '\n': out.append("\\n"); break;
                case '\r': out.append("\\r"); break;
                case '\t': out.append("\\t"); break;
                case '\b': out.append("\\b"); break;
                case '\f': out.append("\\f"); break;
                default:
                    if (c < 0x20 || c > 0x7e) {
                        out.append(String.format("\\u%04x", (int) c));
                    } else {
                        out.append(c);
                    }
            }
        }
        return out.append('"').toString();
    }

    /** A number as Python's {@code :g} writes a whole or short one (300.0 -> 300, 0.5 -> 0.5). */
    static String number(double value) {
        return new BigDecimal(Double.toString(value)).stripTrailingZeros().toPlainString();
    }
}
