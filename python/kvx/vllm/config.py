"""The connector's settings: kv_connector_extra_config, checked by name (docs/vllm.md).

Pure Python, no vLLM: what a user writes in --kv-transfer-config becomes one frozen object,
and a misspelt key is refused naming it rather than ignored."""

import dataclasses
import logging
import os

from .. import AUTH_FILE_ENV, auth_file, auth_key_load
from .params import consumers_needed


@dataclasses.dataclass(frozen=True)
class Settings:
    transfer_mode: str = "pull"  # "pull": D reads P's blocks; "push": P writes D's
    auth_file: str | None = None  # the deployment's secret (default: KVX_AUTH_FILE)
    insecure: bool = False  # no secret: the side channel listens on loopback only
    listen: str | None = None  # P's kvx address, HOST or HOST:PORT (port 0: a free one)
    timeout_ms: int | None = None  # handshake and transfer deadline (kvx.h KVX_DEFAULT_TIMEOUT_MS)
    lease_ms: int | None = None  # how long P holds blocks nobody reads (KVX_DEFAULT_LEASE_MS)
    peer_ttl_ms: int | None = None  # D drops a P idle this long (KVX_DEFAULT_PEER_TTL_MS)
    verify_one_in: int = 0  # verify every Nth transfer with checksums (0: none)
    decode_tp_size: int | None = None  # P: the TP size of the Ds it serves, when larger than P's
    transports: str | None = None  # UCX's transports, a UCX_TLS list (KVX_DEFAULT_TRANSPORTS)


_INTS = ("timeout_ms", "lease_ms", "peer_ttl_ms", "verify_one_in", "decode_tp_size")

# NixlConnector's documented keys (vLLM 0.32), so that a NIXL config switches to kvx by its
# connector name alone: the one that means what a kvx setting means becomes it, the others
# are said once and ignored (kvx has no such knob, or decides it itself)
NIXL_KEYS = {"kv_lease_duration": "lease_ms",  # seconds there, milliseconds here
             "engine_ttl": "peer_ttl_ms"}
NIXL_IGNORED = {
    "backends": "kvx moves bytes with UCX, choosing its transports itself",
    "num_threads": "kvx's transfers run on its own progress thread",
    "enforce_handshake_compat": "kvx always refuses an incompatible peer at its handshake",
    "kv_recompute_threshold": "D loads every prompt P hands over",
    "decoder_kv_blocks_ttl": "not supported",
    "bidirectional_kv_xfer": "not supported",
    "push_registration_timeout": "kvx's push takes timeout_ms",
}
logger = logging.getLogger("vllm.kvx")


def settings_from(extra):
    """Settings from kv_connector_extra_config (a dict or None); ValueError naming the key."""
    extra = dict(extra or {})
    for key in sorted(set(extra) & set(NIXL_IGNORED)):
        logger.warning("kvx: kv_connector_extra_config.%s is NixlConnector's, ignored: %s",
                       key, NIXL_IGNORED[key])
        del extra[key]
    for key, ours in NIXL_KEYS.items():
        if key in extra:
            seconds = extra.pop(key)
            if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or \
                    not 0 < seconds < 2**32 / 1000:
                raise ValueError("kv_connector_extra_config.%s: %r is not a number of seconds"
                                 % (key, seconds))
            if extra.get(ours, round(seconds * 1000)) != round(seconds * 1000):
                raise ValueError("kv_connector_extra_config: %s and %s disagree" % (key, ours))
            extra[ours] = round(seconds * 1000)
    fields = {f.name for f in dataclasses.fields(Settings)}
    unknown = sorted(set(extra) - fields)
    if unknown:
        raise ValueError("kv_connector_extra_config: unknown key%s %s (known: %s)" % (
            "s" if len(unknown) > 1 else "", ", ".join(map(repr, unknown)),
            ", ".join(sorted(fields))))
    if extra.get("transfer_mode", "pull") not in ("pull", "push"):
        raise ValueError("kv_connector_extra_config.transfer_mode: %r is neither \"pull\" nor "
                         "\"push\"" % extra["transfer_mode"])
    for key in _INTS:
        value = extra.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                  or value < 0 or value >= 2**32):
            raise ValueError("kv_connector_extra_config.%s: %r is not an integer in 0..2^32-1"
                             % (key, value))
    if not isinstance(extra.get("insecure", False), bool):
        raise ValueError("kv_connector_extra_config.insecure: %r is not true or false"
                         % extra["insecure"])
    for key in ("auth_file", "listen", "transports"):
        if extra.get(key) is not None and not isinstance(extra[key], str):
            raise ValueError("kv_connector_extra_config.%s: %r is not a string" % (key, extra[key]))
    if extra.get("decode_tp_size") == 0:
        raise ValueError("kv_connector_extra_config.decode_tp_size: 0 is not a TP size")
    settings = Settings(**extra)
    if settings.insecure and settings.auth_file is not None:
        raise ValueError("kv_connector_extra_config: auth_file and insecure: choose one")
    return settings


def consumers_per_rank(settings, tp_size):
    """How many D ranks read each of this P's ranks, so how many dones release a hold
    (params.consumers_needed for decode_tp_size, 1 when unset). P cannot learn D's TP from a
    request, so a deployment whose Ds have more ranks than its Ps says so here; D checks the
    count P signed (params.refusal) and computes the prompt itself when it is not its own.
    ValueError when neither TP size is a multiple of the other."""
    decode = settings.decode_tp_size or 1
    needed = consumers_needed(decode, tp_size)
    if needed is None:
        raise ValueError("kv_connector_extra_config.decode_tp_size %d and this prefill's TP "
                         "size %d: neither is a multiple of the other" % (decode, tp_size))
    return needed


def auth_of(settings):
    """kvx.Agent's auth arguments: {"insecure": True} or {"auth": path}; ValueError when
    there is no secret at all, saying how to give one."""
    if settings.insecure:
        return {"insecure": True}
    path = auth_file(settings.auth_file)
    if path is None:
        raise ValueError("kvx: no secret: set kv_connector_extra_config.auth_file or "
                         "%s to a key file both sides share (kvx auth-key FILE), or "
                         "\"insecure\": true on loopback" % AUTH_FILE_ENV)
    return {"auth": path}


def secret_of(settings):
    """The deployment's secret (bytes), or None when insecure; ValueError as auth_of."""
    auth = auth_of(settings)
    return None if auth.get("insecure") else auth_key_load(os.path.expanduser(auth["auth"]))


def listen_address(settings, worker):
    """HOST:PORT P's side channel binds: settings.listen, else VLLM_HOST_IP or 127.0.0.1 on a
    free port. A port given becomes port + worker, one per worker on the host (its TP rank
    plus its data-parallel rank times the TP size)."""
    listen = settings.listen or os.environ.get("VLLM_HOST_IP") or "127.0.0.1"
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit() or (":" in host and not host.startswith("[")):
        host, port = listen, "0"  # no port, or an IPv6 literal without brackets
    port = int(port)
    return "%s:%d" % (host, port + worker if port else 0)
