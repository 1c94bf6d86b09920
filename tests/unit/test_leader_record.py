"""The leader record (the election value of a driver): same bytes as ever, lenient decoding."""

from __future__ import annotations

import json

from placement.metastore.codec import Corrupt, LeaderRecord, decode_leader, encode_leader


def test_encoding_is_the_compact_sorted_json_object() -> None:
    raw = encode_leader(LeaderRecord("d1", "127.0.0.1:7000"))
    assert (
        raw
        == json.dumps(
            {"id": "d1", "api": "127.0.0.1:7000"}, sort_keys=True, separators=(",", ":")
        ).encode()
    )
    assert decode_leader(raw) == LeaderRecord("d1", "127.0.0.1:7000")


def test_any_json_object_decodes_missing_fields_as_unknown() -> None:
    assert decode_leader(b'{"id": "d1", "api": "h:1"}') == LeaderRecord("d1", "h:1")
    assert decode_leader(b'{"id": 5}') == LeaderRecord("", "")


def test_other_bytes_are_corrupt() -> None:
    assert isinstance(decode_leader(b"d1"), Corrupt)
    assert isinstance(decode_leader(b"[1]"), Corrupt)
    assert isinstance(decode_leader(b"\xff"), Corrupt)
