"""What the connector's halves tell each other: the scheduler's per-step orders to the
workers (holds on P, loads on D), and a worker's kvx address for the scheduler (P)."""

import dataclasses

from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorHandshakeMetadata,
    KVConnectorMetadata,
)


@dataclasses.dataclass
class Hold:
    """P: hold a finished request's blocks under `token` until D reported done (or the lease
    ended), then report `req_id` as finished sending."""
    req_id: str
    kvx_id: int
    token: bytes
    block_ids: list  # per transfer group


@dataclasses.dataclass
class Load:
    """D: load a request's blocks from the P that `params` (P's kv_transfer_params, accepted
    by the scheduler: params.refusal) names."""
    req_id: str
    params: dict
    local_ids: list  # per transfer group: the blocks vLLM allocated for the loaded tokens


@dataclasses.dataclass
class Want:
    """D: a request waits for its turn: heartbeat P so that its hold outlives the wait."""
    req_id: str
    params: dict


@dataclasses.dataclass
class KvxMetadata(KVConnectorMetadata):
    holds: list = dataclasses.field(default_factory=list)
    loads: list = dataclasses.field(default_factory=list)
    wants: list = dataclasses.field(default_factory=list)
    unwants: set = dataclasses.field(default_factory=set)  # D: ended before their load: release
    aborted: set = dataclasses.field(default_factory=set)  # D: requests that ended loading


@dataclasses.dataclass
class KvxHandshake(KVConnectorHandshakeMetadata):
    address: str  # HOST:PORT of one P worker's kvx agent
