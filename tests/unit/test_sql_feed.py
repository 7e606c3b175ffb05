"""The SQL sink's COPY feed: many record batches as one CSV stream, read in any chunk size."""

from __future__ import annotations

import io

import pyarrow as pa
import pyarrow.csv as pcsv
import pytest

from kafka_eos.sinks.sql_store import _CsvFeed


def _batches() -> list[pa.RecordBatch]:
    return [pa.record_batch({"n": pa.array(range(start, start + rows), pa.int64()),
                             "text": pa.array([f'a, "b"\nc {i}' if i % 3 else None for i in range(rows)])})
            for start, rows in ((0, 5), (5, 1), (6, 40), (46, 0), (46, 7))]


def _csv(batches: list[pa.RecordBatch]) -> bytes:
    out = b""
    for batch in batches:
        data = io.BytesIO()
        pcsv.write_csv(batch, data, pcsv.WriteOptions(include_header=False))
        out += data.getvalue()
    return out


@pytest.mark.parametrize("size", [1, 7, 64, 1 << 20, -1])
def test_the_feed_is_every_batch_as_csv_in_order_whatever_the_chunk_size(size):
    feed = _CsvFeed(iter(_batches()))
    chunks = []
    while chunk := feed.read(size):
        assert size < 0 or len(chunk) <= size
        chunks.append(chunk)
    assert b"".join(chunks) == _csv(_batches())
    assert feed.rows == 53
    assert feed.read(size) == b""  # and stays at its end


def test_the_feed_writes_a_batch_only_when_the_reader_gets_to_it():
    taken = []

    def batches():
        for batch in _batches():
            taken.append(batch.num_rows)
            yield batch

    feed = _CsvFeed(batches())
    assert taken == []
    feed.read(3)
    assert taken == [5]
