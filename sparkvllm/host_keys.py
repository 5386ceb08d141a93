"""SSH public host keys: checked to decode, and to be the key type they say they are.

A host key is the only thing that tells the workstation (and the head, for the hop to a
worker) that it talks to the real node, so a key that merely has the right shape is not
enough: the base64 blob must decode to the SSH wire format (RFC 4253 section 6.6, RFC 5656
section 3.1, RFC 8709 section 4), start with the same type name as the text in front of
it, and hold a key of the right size with nothing after it.

    >>> parse_host_key("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAI...")  # doctest: +SKIP
    'ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAI...'
"""

from __future__ import annotations

import base64
import binascii
import struct

HOST_KEY_TYPES = (
    "ssh-ed25519",
    "ecdsa-sha2-nistp256",
    "ecdsa-sha2-nistp384",
    "ecdsa-sha2-nistp521",
    "ssh-rsa",
)
# Uncompressed EC points (0x04 || X || Y) per curve.
_EC_POINT_BYTES = {"nistp256": 65, "nistp384": 97, "nistp521": 133}
_MIN_RSA_BITS = 2048

HOST_KEY_FIX = "paste the `ssh-ed25519 AAAA...` part of `ssh-keyscan -t ed25519 HOST` for that node"


class HostKeyError(ValueError):
    """Not a usable SSH public host key; the message says why (no fix: callers add it)."""


def _strings(blob: bytes) -> list[bytes]:
    """The SSH wire `string` fields of `blob` (uint32 length, then that many bytes)."""
    out, i = [], 0
    while i < len(blob):
        if i + 4 > len(blob):
            raise HostKeyError("the key data ends in the middle of a field")
        (n,) = struct.unpack(">I", blob[i : i + 4])
        i += 4
        if i + n > len(blob):
            raise HostKeyError("the key data is cut short")
        out.append(blob[i : i + n])
        i += n
    return out


def parse_host_key(text: str) -> str:
    """`type base64` (a trailing comment dropped) when it is a real public key of that
    type; HostKeyError otherwise."""
    words = text.split()
    if len(words) < 2:
        raise HostKeyError("expected `TYPE BASE64` (e.g. ssh-ed25519 AAAA...)")
    kind, data = words[0], words[1]
    if kind not in HOST_KEY_TYPES:
        raise HostKeyError(f"{kind[:40]!r} is not a host key type ({', '.join(HOST_KEY_TYPES)})")
    try:
        blob = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise HostKeyError("the key data is not valid base64") from None
    fields = _strings(blob)
    named = fields[0].decode("ascii", "replace") if fields else ""
    if named != kind:
        raise HostKeyError(
            f"the text says {kind} but the key data is a {named[:40] or 'blank'} key"
        )
    body = fields[1:]
    if kind == "ssh-ed25519":
        ok = len(body) == 1 and len(body[0]) == 32
    elif kind == "ssh-rsa":
        ok = len(body) == 2 and (len(body[1].lstrip(b"\0")) * 8) >= _MIN_RSA_BITS - 8
    else:
        curve = kind.rsplit("-", 1)[1]
        ok = (
            len(body) == 2
            and body[0] == curve.encode()
            and len(body[1]) == _EC_POINT_BYTES[curve]
            and body[1][:1] == b"\x04"
        )
    if not ok:
        raise HostKeyError(f"the key data is not a well-formed {kind} public key")
    return f"{kind} {data}"


def find_host_key(text: str) -> str:
    """The first host key in a file's text: a `.pub` file (`TYPE BASE64 comment`) or an
    `ssh-keyscan` line (`HOST TYPE BASE64`)."""
    words = text.split()
    for i, w in enumerate(words[:-1]):
        if w in HOST_KEY_TYPES:
            return parse_host_key(f"{w} {words[i + 1]}")
    raise HostKeyError("the file holds no SSH public host key")
