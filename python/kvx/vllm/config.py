"""The connector's settings: kv_connector_extra_config, checked by name (docs/vllm.md).

Pure Python, no vLLM: what a user writes in --kv-transfer-config becomes one frozen object,
and a misspelt key is refused naming it rather than ignored."""

import dataclasses
import os

from .. import AUTH_FILE_ENV, auth_file, auth_key_load


@dataclasses.dataclass(frozen=True)
class Settings:
    transfer_mode: str = "pull"  # "pull": D reads P's blocks; "push": P writes D's
    auth_file: str | None = None  # the deployment's secret (default: KVX_AUTH_FILE)
    insecure: bool = False  # no secret: the side channel listens on loopback only
    listen: str | None = None  # P's kvx address, HOST or HOST:PORT (port 0: a free one)
    timeout_ms: int | None = None  # handshake and transfer deadline (kvx.h KVX_DEFAULT_TIMEOUT_MS)
    lease_ms: int | None = None  # how long P holds blocks nobody reads (KVX_DEFAULT_LEASE_MS)
    verify_one_in: int = 0  # verify every Nth transfer with checksums (0: none)


_INTS = ("timeout_ms", "lease_ms", "verify_one_in")


def settings_from(extra):
    """Settings from kv_connector_extra_config (a dict or None); ValueError naming the key."""
    extra = dict(extra or {})
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
    for key in ("auth_file", "listen"):
        if extra.get(key) is not None and not isinstance(extra[key], str):
            raise ValueError("kv_connector_extra_config.%s: %r is not a string" % (key, extra[key]))
    settings = Settings(**extra)
    if settings.insecure and settings.auth_file is not None:
        raise ValueError("kv_connector_extra_config: auth_file and insecure: choose one")
    return settings


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


def listen_address(settings, tp_rank):
    """HOST:PORT P's side channel binds: settings.listen, else VLLM_HOST_IP or 127.0.0.1 on a
    free port. A port given for TP rank r > 0 becomes port + r, one per worker."""
    listen = settings.listen or os.environ.get("VLLM_HOST_IP") or "127.0.0.1"
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit() or (":" in host and not host.startswith("[")):
        host, port = listen, "0"  # no port, or an IPv6 literal without brackets
    port = int(port)
    return "%s:%d" % (host, port + tp_rank if port else 0)
