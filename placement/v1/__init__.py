"""Generated from proto/placement/v1 — do not edit; run scripts/gen_proto.py."""
