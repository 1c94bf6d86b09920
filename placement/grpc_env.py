"""The environment gRPC's C core reads when it is first imported: entry points call
:func:`quiet_grpc_core` before anything imports ``grpc``."""

from __future__ import annotations

import os


def quiet_grpc_core() -> None:
    """gRPC's core logs transport failures on stderr itself ("E1124 ... Corruption detected"),
    around the one line our commands print for them (design/deployment.md, "Credential
    errors"). Silence it unless the operator set ``GRPC_VERBOSITY`` (e.g. ``debug``)."""
    os.environ.setdefault("GRPC_VERBOSITY", "NONE")
