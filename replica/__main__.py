"""``python -m replica --node NAME --listen HOST:PORT --data-dir DIR [--etcd ENDPOINTS [--prefix P]
[--attribute K=V ...]]``: run one replica agent (with ``--etcd`` it registers its node record).

Exit status: 0 after SIGTERM/SIGINT, 1 after a fatal store error, 2 for bad input (one line on
stderr naming the field).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

from placement.errors import InvalidInput, PlacementError
from replica.data.plane import DataConfig
from replica.registration import parse_attributes
from replica.server import serve


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m replica", description=__doc__)
    parser.add_argument("--node", required=True, help="this node's name (1-64 of [A-Za-z0-9_.-])")
    parser.add_argument("--listen", required=True, help="HOST:PORT to serve on; port 0 = any free")
    parser.add_argument("--data-dir", required=True, type=Path, help="directory of agent.db")
    parser.add_argument("--grace", type=float, default=5.0, help="seconds for in-flight RPCs")
    parser.add_argument("--etcd", help="etcd HOST:PORT[,...]: register this node there")
    parser.add_argument("--prefix", default="/placement", help="metastore key prefix")
    parser.add_argument(
        "--attribute", action="append", default=[], help="KEY=VALUE node attribute (repeatable)"
    )
    parser.add_argument("--lease-ttl", type=int, default=5, help="registration lease seconds")
    parser.add_argument(
        "--catch-up-mbps", type=float, default=64.0, help="catch-up bandwidth, MB/s (0 = no limit)"
    )
    parser.add_argument(
        "--isr-timeout",
        type=float,
        default=3.0,
        help="seconds before a silent replica leaves the ISR",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
    )
    try:
        if args.catch_up_mbps < 0:
            raise InvalidInput("--catch-up-mbps", f"{args.catch_up_mbps} is negative", "use >= 0")
        if args.isr_timeout < 0.2:
            raise InvalidInput("--isr-timeout", f"{args.isr_timeout} is too short", "use >= 0.2")
        attributes = parse_attributes(args.attribute)
        return asyncio.run(
            serve(
                args.node,
                args.listen,
                args.data_dir,
                grace=args.grace,
                etcd=args.etcd,
                prefix=args.prefix,
                attributes=attributes,
                lease_ttl=args.lease_ttl,
                data_config=DataConfig(
                    isr_timeout=args.isr_timeout, catch_up_bytes_per_s=args.catch_up_mbps * 1e6
                ),
            )
        )
    except PlacementError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
