"""The snapshot file's schema as pydantic models: what
:func:`placement.pipeline.snapshot.parse_snapshot` accepts, and where it says a snapshot is wrong.

Imported only for a snapshot that is not plain (``snapshot._plain`` recognises the usual file
without pydantic, whose import and validation cost a large plan about a tenth of its time): the
models then validate it, and their first error is the one reported.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StrictFloat, StrictInt, StrictStr

from placement.core.limits import MAX_PARTITIONS, MAX_REPLICAS, NAME_PATTERN
from placement.core.names import NAME_HINT, is_name


def _name(text: str) -> str:
    """The one name rule (:mod:`placement.core.names`) beyond the pattern: not ``.`` or ``..``."""
    if not is_name(text):
        raise ValueError(f"{text!r} is not a valid name ({NAME_HINT})")
    return text


Name = Annotated[StrictStr, Field(pattern=NAME_PATTERN), AfterValidator(_name)]


class NodeIn(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    name: Name
    attributes: dict[StrictStr, StrictStr] = Field(default_factory=dict)
    weight: Annotated[StrictFloat | StrictInt, Field(gt=0)] = 1.0


class ZoneIn(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    name: Name
    partitions: Annotated[StrictInt, Field(ge=1, le=MAX_PARTITIONS)]
    replicas: Annotated[StrictInt, Field(ge=1, le=MAX_REPLICAS)]
    node_selector: dict[StrictStr, StrictStr] = Field(default_factory=dict)
    failure_domain: StrictStr | None = None
    min_in_sync: Annotated[StrictInt, Field(ge=1, le=MAX_REPLICAS)] | None = None
    #: Its names are checked by ``snapshot._check_stable_names``, once per distinct name: the
    #: same rule as ``Name``, whose per-item Python validator cost 0.5 s for 300,000 replicas.
    stable: dict[StrictStr, list[StrictStr]] = Field(default_factory=dict)


class SnapshotIn(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    nodes: list[NodeIn]
    zones: list[ZoneIn]
