"""What counts as a hostname, an address, a user name and a public key — one place.

Every name that reaches a file the agent writes (hostfile, ssh config, known_hosts,
authorized_keys, records) passes one of these first, so no value can carry a newline,
a space or an ssh option. Standard library only: the resident supervisor uses them.
"""

from __future__ import annotations

import ipaddress
import re

# RFC 1123 labels: letters, digits and inner hyphens, 1–63 characters; a trailing dot.
DNS_NAME_PATTERN = r"(?!-)[A-Za-z0-9-]{1,63}(?<!-)(?:\.(?!-)[A-Za-z0-9-]{1,63}(?<!-))*\.?"
_DNS_NAME = re.compile(DNS_NAME_PATTERN)
_MAYBE_IPV4 = re.compile(r"[0-9.]+")
# Linux interface names: up to 15 bytes, no '/', ':' or whitespace. We are stricter.
_IFACE = re.compile(r"[A-Za-z0-9_.-]{1,15}")
# OpenSSH's KexAlgorithms: names and commas; a leading +, - or ^ edits ssh's default list.
_KEX = re.compile(r"[+^-]?[A-Za-z0-9@._-]+(,[A-Za-z0-9@._-]+)*")
# A path the agent writes into ssh_config/sshd_config, or into `ssh -F PATH` (split on
# spaces by Open MPI): absolute, and no character that could end a value or a line.
_PLAIN_PATH = re.compile(r"/[A-Za-z0-9_./@+-]*")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_USER = re.compile(r"[a-z_][a-z0-9_.-]{0,31}")
# One OpenSSH public key: its type and base64 blob, nothing else (no options, no comment).
_PUBLIC_KEY = re.compile(
    r"(ssh-ed25519|ssh-rsa|ecdsa-sha2-nistp(?:256|384|521)) [A-Za-z0-9+/]{16,8192}={0,3}"
)


def is_dns_name(text: str) -> bool:
    """A syntactically valid DNS name (RFC 1123 labels, ≤ 253 characters)."""
    name = text[:-1] if text.endswith(".") else text
    return 0 < len(name) <= 253 and _DNS_NAME.fullmatch(text) is not None


def is_ip_literal(text: str) -> bool:
    # ipaddress raises (slowly) for every hostname; only digits-and-dots or a colon
    # can be an address at all.
    if ":" not in text and not _MAYBE_IPV4.fullmatch(text):
        return False
    # An IPv6 zone (`fe80::1%eth0`): ipaddress accepts *any* text after the '%' —
    # newlines, spaces, quotes — so an "address" in a worker's record could carry an ssh
    # option into the launcher's ssh config (`::1%\n  ProxyCommand …`; found by
    # tests/test_fuzz_names.py). A zone is an interface name or number.
    _, percent, zone = text.partition("%")
    if percent and not is_iface_name(zone):
        return False
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def is_host(text: str) -> bool:
    return is_dns_name(text) or is_ip_literal(text)


def is_iface_name(text: str) -> bool:
    return _IFACE.fullmatch(text) is not None


def is_kex_list(text: str) -> bool:
    """A value for ssh's KexAlgorithms (nothing that could end the config line)."""
    return _KEX.fullmatch(text) is not None


def is_env_name(text: str) -> bool:
    """A portable environment variable name (one that can be forwarded with -x)."""
    return _ENV_NAME.fullmatch(text) is not None


def is_user_name(text: str) -> bool:
    return _USER.fullmatch(text) is not None


def is_public_key(text: str) -> bool:
    """Exactly `type base64` of one OpenSSH public key."""
    return _PUBLIC_KEY.fullmatch(text) is not None


def is_plain_path(text: str) -> bool:
    """An absolute path of letters, digits and `_ . / @ + -` only."""
    return _PLAIN_PATH.fullmatch(text) is not None


def fingerprint(public: str) -> str:
    """`SHA256:…` of an OpenSSH public key line, as `ssh-keygen -l` prints it: how a key is
    named in logs (never the key itself, though it is not secret)."""
    import base64
    import binascii
    import hashlib

    try:
        blob = base64.b64decode(public.split()[1], validate=True)
    except (IndexError, ValueError, binascii.Error):
        return "SHA256:(not a key)"
    return "SHA256:" + base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")
