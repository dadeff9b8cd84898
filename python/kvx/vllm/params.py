"""The kv_transfer_params P hands D through whatever router sits between them, and what D
accepts of them (docs/vllm.md, "What D accepts").

A router, a client or anyone who can post a completion to D can put kv_transfer_params in the
request: D must load only what a P of this deployment handed over for this prompt. So P signs
the fields that name what D reads (HMAC-SHA256 under a key derived from the deployment's
secret, the key file both sides already share), and D checks the signature, the prompt digest
and the token before it connects to anyone. Params that fail are not a load: D computes the
prompt itself. Without a secret (`insecure`, loopback only) nothing is signed and D checks
the rest."""

import hashlib
import hmac
import json
import struct

VERSION = 1  # of the params below; D refuses others
TOKEN_LEN = 16

# the fields the signature covers: everything D acts on (do_remote_* are flags D rewrites)
SIGNED = ("kvx", "remote_engine_id", "remote_request_id", "remote_token", "remote_block_ids",
          "remote_addresses", "remote_num_tokens", "prompt_digest", "transfer_mode",
          "remote_consumers")


def prompt_digest(token_ids):
    """What D checks its prompt against before loading: a reference handed to another prompt
    is refused without a byte read (SHA-256 of the token ids, 16 bytes hex)."""
    ids = list(token_ids or ())
    return hashlib.sha256(struct.pack("<%dq" % len(ids), *ids)).hexdigest()[:32]


def signing_key(secret):
    """The key P signs params with, derived from the deployment's secret (None: insecure), so
    that the secret itself never signs anything a client sees."""
    if secret is None:
        return None
    return hmac.new(secret, b"kvx vllm kv_transfer_params v1", hashlib.sha256).digest()


def signature(key, params):
    """The signature of `params`' SIGNED fields under `key` (hex)."""
    signed = {name: params.get(name) for name in SIGNED}
    text = json.dumps(signed, sort_keys=True, separators=(",", ":")).encode()
    return hmac.new(key, text, hashlib.sha256).hexdigest()


def make(key, *, engine_id, request_id, token, block_ids, addresses, num_tokens, prompt_ids,
         transfer_mode, consumers=1):
    """P's params for D, signed when there is a key."""
    params = {
        "do_remote_prefill": True,
        "do_remote_decode": False,
        "kvx": VERSION,
        "remote_engine_id": engine_id,
        "remote_request_id": request_id,
        "remote_token": token.hex(),
        "remote_block_ids": block_ids,
        "remote_addresses": addresses,
        "remote_num_tokens": num_tokens,
        "prompt_digest": prompt_digest(prompt_ids),
        "transfer_mode": transfer_mode,
        "remote_consumers": consumers,  # the D ranks each P rank's hold waits for
    }
    if key is not None:
        params["signature"] = signature(key, params)
    return params


def consumers_needed(decode_tp, prefill_tp):
    """The dones each P rank's hold must wait for when a D of `decode_tp` ranks reads a P of
    `prefill_tp`: decode_tp / prefill_tp when D has more ranks (each reads a part of one P
    rank), else 1; None when neither TP size divides the other (kvx's plan refuses those)."""
    big, small = max(decode_tp, prefill_tp), min(decode_tp, prefill_tp)
    if big % small:
        return None
    return decode_tp // prefill_tp if decode_tp > prefill_tp else 1


def refusal(key, params, digest, num_tokens, decode_tp=1):
    """Why D (of `decode_tp` ranks) must not load with `params` for the `num_tokens` prompt
    tokens of `digest` that it takes from P, or None when it may: the version, the signature
    (with a key), the prompt, the token count, a real token, well-formed fields, and holds that
    wait for as many dones as D's ranks will send."""
    if params.get("kvx") != VERSION:
        return "not kvx's (version %r, this is %d)" % (params.get("kvx"), VERSION)
    if key is not None:
        given = params.get("signature")
        if not isinstance(given, str) or not hmac.compare_digest(given, signature(key, params)):
            return "not signed by a P of this deployment (another secret, or made elsewhere)"
    if params.get("prompt_digest") != digest:
        return "they belong to another prompt"
    if params.get("remote_num_tokens") != num_tokens:
        # D pairs its blocks with P's last ones: a P that generated past the prompt (a router
        # that did not give it max_tokens 1) ends on other blocks
        return "P's KV covers %r tokens, this request loads the prompt's %d (a P that " \
            "generated past the prompt)" % (params.get("remote_num_tokens"), num_tokens)
    try:
        token = bytes.fromhex(params["remote_token"])
    except (KeyError, TypeError, ValueError):
        token = b""
    if len(token) != TOKEN_LEN or not any(token):
        return "no hold token (P hands over a random %d-byte one with every hold)" % TOKEN_LEN
    if not isinstance(params.get("remote_request_id"), int):
        return "the request id is not an integer"
    addresses = params.get("remote_addresses")
    if not isinstance(addresses, list) or not addresses or \
            not all(isinstance(a, str) for a in addresses):
        return "no prefill addresses"
    blocks = params.get("remote_block_ids")
    if not isinstance(blocks, list) or not all(
            isinstance(ids, list) and all(isinstance(b, int) and b >= 0 for b in ids)
            for ids in blocks):
        return "the block ids are not lists of integers per group"
    needed = consumers_needed(decode_tp, len(addresses))
    held_for = params.get("remote_consumers", 1)
    if needed is None:
        return "a decode TP of %d cannot read a prefill TP of %d (neither divides the other)" \
            % (decode_tp, len(addresses))
    if held_for != needed:
        # fewer: P would release its blocks at the first done while other ranks still read;
        # more: P would hold them for dones that never come, to the lease's end
        return "P's holds wait for %r decode ranks per prefill rank, this D's TP %d needs %d " \
            "(set kv_connector_extra_config.decode_tp_size to %d on P)" \
            % (held_for, decode_tp, needed, decode_tp)
    return None
