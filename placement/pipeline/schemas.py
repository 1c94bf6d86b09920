"""The Parquet schemas of an export directory (one file per table; design/pipeline.md).

Apart from the rows' validation (:mod:`.rows`), so that planning a JSON snapshot needs no pyarrow.
"""

from __future__ import annotations

from collections.abc import Mapping

import pyarrow as pa

_STR_MAP = pa.map_(pa.string(), pa.string())
_PEERS = pa.list_(pa.string())

NODES = pa.schema(
    [
        ("name", pa.string()),
        ("address", pa.string()),
        ("attributes", _STR_MAP),
        ("weight", pa.float64()),
        ("mod_revision", pa.int64()),
    ]
)
ZONES = pa.schema(
    [
        ("name", pa.string()),
        ("partitions", pa.int32()),
        ("replicas", pa.int32()),
        ("node_selector", _STR_MAP),
        ("failure_domain", pa.string()),
        ("scale_up_delay", pa.float64()),
        ("scale_down_delay", pa.float64()),
        ("mod_revision", pa.int64()),
    ]
)
ASSIGNMENTS = pa.schema(
    [
        ("zone", pa.string()),
        ("partition", pa.int32()),
        ("field", pa.string()),
        ("peers", _PEERS),
        ("epoch", pa.int64()),
        ("ts", pa.int64()),
        ("trigger", pa.int64()),
        ("mod_revision", pa.int64()),
    ]
)
PRIMARIES = pa.schema(
    [
        ("zone", pa.string()),
        ("partition", pa.int32()),
        ("node", pa.string()),
        ("lease_epoch", pa.int64()),
        ("expiry", pa.int64()),
        ("mod_revision", pa.int64()),
    ]
)
SIZES = pa.schema(
    [
        ("zone", pa.string()),
        ("partition", pa.int32()),
        ("node", pa.string()),
        ("bytes", pa.int64()),
        ("keys", pa.int64()),
        ("ts", pa.int64()),
    ]
)
HISTORY = pa.schema(
    [
        ("revision", pa.int64()),
        ("zone", pa.string()),
        ("partition", pa.int32()),
        ("field", pa.string()),
        ("event", pa.string()),
        ("peers", _PEERS),
        ("prev_peers", _PEERS),
        ("ts", pa.int64()),
        ("epoch", pa.int64()),
    ]
)

#: Every table of an export directory; the plan needs the first three, sizes when present.
#: Every table of an export directory.
TABLES: Mapping[str, pa.Schema] = {
    "nodes": NODES,
    "zones": ZONES,
    "assignments": ASSIGNMENTS,
    "sizes": SIZES,
    "primaries": PRIMARIES,
    "history": HISTORY,
}
