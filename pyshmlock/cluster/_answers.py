"""What an etcd member answers, parsed and type-checked: the one place where
the network's bytes become values (docs/DESIGN.md §11, "Client").

Every parser raises ``Malformed`` (or one of ``PARSE_ERRORS``) for an answer
not shaped as etcd's; the client then counts it as that member's failure
and moves on.  etcd's JSON gateway writes 64-bit integers as strings and
leaves out fields whose value is 0.
"""
from __future__ import annotations

import base64
from typing import Any, Dict, List, Optional, Tuple

from ._errors import EtcdError

__all__ = ["PARSE_ERRORS", "Compacted", "Malformed", "b64", "decode_kv", "parse_grant",
           "parse_keepalive", "parse_object", "parse_range", "parse_token", "parse_ttl",
           "parse_txn", "parse_watch", "unb64", "why"]


def b64(x: Any) -> str:
    if isinstance(x, str):
        x = x.encode()
    return base64.b64encode(x).decode()


def unb64(x: Optional[str]) -> bytes:
    return base64.b64decode(x, validate=True) if x else b""


class Compacted(Exception):
    """The watch's start revision was compacted away: read the state again."""


class Malformed(ValueError):
    """An answer that is not shaped as etcd's."""


#: What parsing an untrusted answer may raise (a Malformed, or a stray
#: error of a conversion: each means "this member answered badly").
PARSE_ERRORS = (ValueError, TypeError, KeyError, AttributeError, IndexError, OverflowError,
                 RecursionError)


def why(e: BaseException) -> str:
    text = str(e)[:160]
    return text if isinstance(e, Malformed) else f"{type(e).__name__}: {text}"


def parse_object(v: Any, what: str = "answer") -> Dict[str, Any]:
    if not isinstance(v, dict):
        raise Malformed(f"{what} is a {type(v).__name__}, not an object")
    return v


def _list(v: Any, what: str) -> List[Any]:
    if not isinstance(v, list):
        raise Malformed(f"{what} is a {type(v).__name__}, not a list")
    return v


def _int(v: Any, what: str) -> int:
    """etcd's JSON gateway writes 64-bit integers as strings."""
    if isinstance(v, int) and not isinstance(v, bool):
        return v
    if isinstance(v, str) and 0 < len(v) <= 21 and (v.isdigit() or (
            v[0] == "-" and v[1:].isdigit())) and v.isascii():
        return int(v)
    raise Malformed(f"{what} is {v!r:.40}, not an integer")


def _revision(r: Dict[str, Any]) -> int:
    return _int(parse_object(r.get("header"), "header").get("revision"), "header.revision")


def decode_kv(kv: Any) -> Dict[str, Any]:
    """A key-value of an answer, decoded and type-checked."""
    kv = parse_object(kv, "kv")
    key = kv.get("key")
    if not isinstance(key, str) or not key:
        raise Malformed("kv without a key")
    value = kv.get("value", "")
    if not isinstance(value, str):
        raise Malformed("kv value is not a string")
    return {"key": unb64(key).decode(), "value": unb64(value),
            "create_revision": _int(kv.get("create_revision", 0), "create_revision"),
            "mod_revision": _int(kv.get("mod_revision", 0), "mod_revision"),
            "lease": _int(kv.get("lease", 0), "lease")}


def parse_range(r: Any) -> Tuple[List[Dict[str, Any]], int]:
    r = parse_object(r)
    return [decode_kv(kv) for kv in _list(r.get("kvs", []), "kvs")], _revision(r)


def parse_txn(r: Any) -> Tuple[bool, int, List[List[Dict[str, Any]]]]:
    r = parse_object(r)
    ok = r.get("succeeded", False)
    if not isinstance(ok, bool):
        raise Malformed("succeeded is not a boolean")
    out: List[List[Dict[str, Any]]] = []
    for x in _list(r.get("responses", []), "responses"):
        x = parse_object(x, "response")
        rng = x.get("response_range")
        out.append([] if rng is None else
                   [decode_kv(kv) for kv in _list(parse_object(rng, "response_range")
                                                  .get("kvs", []), "kvs")])
    return ok, _revision(r), out


def parse_grant(r: Any) -> int:
    r = parse_object(r)
    if r.get("error"):
        raise EtcdError(f"etcd refused a lease: {str(r['error'])[:200]}")
    lease = _int(r.get("ID"), "ID")
    if lease <= 0:
        raise Malformed(f"lease ID {lease}")
    return lease


def parse_keepalive(r: Any) -> int:
    r = parse_object(r)
    res = parse_object(r.get("result", r), "result")
    return _int(res.get("TTL", 0), "TTL")


def parse_ttl(r: Any) -> Tuple[int, int]:
    # The gateway leaves out fields whose value is 0: no "TTL" is under a
    # second left (an expired lease says -1).
    r = parse_object(r)
    return _int(r.get("TTL", 0), "TTL"), _int(r.get("grantedTTL", 0), "grantedTTL")


def parse_token(r: Any) -> str:
    tok = parse_object(r).get("token", "")
    if not isinstance(tok, str):
        raise Malformed("token is not a string")
    return tok


def parse_watch(obj: Any) -> Optional[Tuple[int, List[Dict[str, Any]]]]:
    """One watch message: (revision, events), or None for one without
    events; raises Compacted, or EtcdError for a cancelled watch."""
    res = parse_object(parse_object(obj, "watch message").get("result", {}), "result")
    compact = _int(res.get("compact_revision", 0), "compact_revision")
    if compact > 0:
        raise Compacted(compact)
    if res.get("canceled"):
        raise EtcdError(f"watch canceled: {str(res.get('cancel_reason', ''))[:200]}")
    evs = _list(res.get("events", []), "events")
    if not evs:
        return None
    out = []
    for ev in evs:
        ev = parse_object(ev, "event")
        kv = decode_kv(ev.get("kv"))
        kind = ev.get("type", "PUT")
        if kind not in ("PUT", "DELETE"):
            raise Malformed(f"event type {kind!r:.40}")
        kv["type"] = kind
        out.append(kv)
    return out[-1]["mod_revision"], out
