"""Documented bounds on zone configurations, enforced wherever a config enters the system."""

from __future__ import annotations

#: Largest partition count a zone may have (partition ids are 0..MAX_PARTITIONS-1).
MAX_PARTITIONS = 65_536
#: Largest replica count a zone may ask for.
MAX_REPLICAS = 64
#: Allowed zone and node names: letters, digits, ``_ . -``; 1..64 characters.
NAME_PATTERN = r"^[A-Za-z0-9_.-]{1,64}$"
#: Most KEY=VALUE pairs in a zone's node selector or a node's attributes. With keys and values of
#: at most 64 characters a zone config or node record stays a few KiB — far below etcd's request
#: limit (1.5 MiB), so no such write can fail there (design/metastore.md, "Batches and etcd's
#: limits").
MAX_PAIRS = 32
