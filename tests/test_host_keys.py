"""Host keys decode, and are the type they say they are (keys made by ssh-keygen here)."""

from __future__ import annotations

import base64
import subprocess
from pathlib import Path

import pytest

from sparkvllm.host_keys import HostKeyError, find_host_key, parse_host_key

KINDS = [("ed25519", None), ("ecdsa", "256"), ("ecdsa", "384"), ("ecdsa", "521"), ("rsa", "2048")]


def _public_key(tmp_path: Path, kind: str, bits: str | None) -> str:
    key = tmp_path / f"{kind}{bits or ''}"
    argv = ["ssh-keygen", "-q", "-t", kind, "-N", "", "-C", "me@example", "-f", str(key)]
    subprocess.run([*argv, *(["-b", bits] if bits else [])], check=True)
    return (tmp_path / f"{key.name}.pub").read_text()


@pytest.mark.parametrize(("kind", "bits"), KINDS)
def test_real_keys_of_every_type_are_accepted(tmp_path: Path, kind: str, bits: str | None) -> None:
    pub = _public_key(tmp_path, kind, bits)
    kind_name, data, _comment = pub.split()
    assert parse_host_key(pub) == f"{kind_name} {data}"  # the comment is dropped
    assert find_host_key(f"10.0.0.5 {kind_name} {data}\n") == f"{kind_name} {data}"


def test_a_key_under_another_types_name_is_refused(tmp_path: Path) -> None:
    _, data, _ = _public_key(tmp_path, "ed25519", None).split()
    with pytest.raises(HostKeyError, match="says ssh-rsa but the key data is a ssh-ed25519 key"):
        parse_host_key(f"ssh-rsa {data}")
    _, data, _ = _public_key(tmp_path, "ecdsa", "256").split()
    with pytest.raises(HostKeyError, match="ecdsa-sha2-nistp384 but the key data is a ecdsa"):
        parse_host_key(f"ecdsa-sha2-nistp384 {data}")


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("ssh-ed25519 AAAA", "ends in the middle of a field"),
        ("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5", "not a well-formed ssh-ed25519 public key"),
        ("ssh-ed25519 AAAA*AAA", "not valid base64"),
        ("ssh-ed25519", "expected `TYPE BASE64`"),
        ("ssh-dss AAAAB3NzaC1kc3M=", "is not a host key type"),
        ("$(touch /tmp/p) AAAA", "is not a host key type"),
    ],
)
def test_malformed_keys_say_why(text: str, problem: str) -> None:
    with pytest.raises(HostKeyError) as info:
        parse_host_key(text)
    assert problem in str(info.value)


def test_trailing_bytes_and_short_keys_are_refused(tmp_path: Path) -> None:
    _, data, _ = _public_key(tmp_path, "ed25519", None).split()
    blob = base64.b64decode(data)
    for bad in (blob + b"\0\0\0\1x", blob[:-1]):
        with pytest.raises(HostKeyError):
            parse_host_key("ssh-ed25519 " + base64.b64encode(bad).decode())


def test_a_file_without_a_key_is_refused() -> None:
    with pytest.raises(HostKeyError, match="holds no SSH public host key"):
        find_host_key("# nothing here\n")
