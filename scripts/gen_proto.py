"""Regenerates placement/v1 (protobuf + gRPC Python code and .pyi stubs) from proto/.

The one way generated code is produced; tests/unit/test_proto_current.py fails when the
checked-in output differs from what this script would write.

    .venv/bin/python scripts/gen_proto.py            # write placement/v1
    .venv/bin/python scripts/gen_proto.py --out DIR  # write elsewhere (used by the test)
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path

from grpc_tools import protoc

ROOT = Path(__file__).resolve().parent.parent
PROTO_ROOT = ROOT / "proto"
PACKAGE = Path("placement") / "v1"
INIT = '"""Generated from proto/placement/v1 — do not edit; run scripts/gen_proto.py."""\n'


def generate(out_root: Path) -> Path:
    """Generates into ``out_root/placement/v1`` and returns that directory."""
    protos = sorted(str(p.relative_to(PROTO_ROOT)) for p in (PROTO_ROOT / PACKAGE).glob("*.proto"))
    include = Path(protoc.__file__).parent / "_proto"
    # The mypy-protobuf plugins sit next to this interpreter (the venv's bin directory).
    os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    with tempfile.TemporaryDirectory() as tmp:
        args = [
            "grpc_tools.protoc",
            f"-I{PROTO_ROOT}",
            f"-I{include}",
            f"--python_out={tmp}",
            f"--grpc_python_out={tmp}",
            f"--mypy_out={tmp}",
            f"--mypy_grpc_out={tmp}",
            *protos,
        ]
        if protoc.main(args) != 0:
            raise SystemExit("protoc failed")
        target = out_root / PACKAGE
        if target.exists():
            shutil.rmtree(target)
        shutil.copytree(Path(tmp) / PACKAGE, target)
    (target / "__init__.py").write_text(INIT)
    (target / "py.typed").write_text("")
    return target


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=ROOT, help="root to write placement/v1 under")
    args = parser.parse_args(argv)
    print(generate(args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
