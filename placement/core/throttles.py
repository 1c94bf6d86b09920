"""The driver's throttles' defaults (``placectl driver run --max-moves``, ``--max-moves-per-node``,
``--max-mib-per-node``; design/control-plane.md, "Throttles"): the bytes a joining node copies
at once bound the data moved; the counts bound the driver's and an agent's concurrent work for
moves that copy (almost) nothing. No imports: the CLI reads these without loading the driver."""

from __future__ import annotations

#: Partitions being moved at once, in total.
DEFAULT_MAX_MOVES = 1024
#: Partitions being moved at once onto one node.
DEFAULT_MAX_MOVES_PER_NODE = 256
#: Bytes being copied at once onto one node (each move counts its partition's largest replica).
DEFAULT_MAX_BYTES_PER_NODE = 256 * 2**20
#: What a move counts against its node's byte budget at least (an empty partition still costs
#: a catch-up: records, a learner, an in-sync-set join).
MOVE_FLOOR_BYTES = 2**20
