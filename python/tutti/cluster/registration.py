"""A node's registration with Mooncake's HTTP metadata server, asked for when a start fails: the server
refuses a second registration under the same endpoint ("Duplicate rpc_meta key not allowed").  One whose
RPC address answers is a live node configured with the same endpoint; one that does not was left by a
process that ended without closing (killed, crashed), until the master drops it.  (Removing it was tried:
the new process then died of a segfault in Mooncake's start, the master still holding the dead node.)"""
from __future__ import annotations

import http.client
import json
import socket
import urllib.parse
import urllib.request

RPC_META = "mooncake/rpc_meta/{}"   # the transfer engine's address under its endpoint


def _url(metadata: str, key: str) -> str:
    return f"{metadata}?key={urllib.parse.quote(key, safe='')}"


def registered(metadata: str, endpoint: str, timeout: float) -> dict | None:
    """The RPC address registered under ``endpoint`` ({"ip_or_host_name", "rpc_port"}), or None (none, not
    an HTTP metadata server, or it cannot be asked)."""
    if not metadata.startswith(("http://", "https://")):
        return None
    try:
        with urllib.request.urlopen(_url(metadata, RPC_META.format(endpoint)), timeout=timeout) as r:
            meta = json.loads(r.read())
    except (OSError, ValueError, http.client.HTTPException):  # a reply cut short is not an answer either
        return None
    if not isinstance(meta, dict) or "ip_or_host_name" not in meta or "rpc_port" not in meta:
        return None
    return meta


def alive(meta: dict, timeout: float) -> bool:
    """Does the registered RPC address accept a connection (a live transfer engine)?"""
    try:
        with socket.create_connection((str(meta["ip_or_host_name"]), int(meta["rpc_port"])), timeout=timeout):
            return True
    except (OSError, ValueError, OverflowError):
        return False
