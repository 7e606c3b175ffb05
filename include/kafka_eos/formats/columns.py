"""The columns decoding adds to a source's rows (one module, so the decoders of every format and
the package that joins them name them alike)."""

#: Prefix of the decoded struct's column: ``_kafka_eos_<key|value>``.
DECODED = "_kafka_eos_"
#: Suffix of the column holding why a record did not decode: ``_kafka_eos_<key|value>_reason``.
REASON = "_reason"
