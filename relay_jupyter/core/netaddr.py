"""Loopback: the one host test every outbound URL policy shares (model servers, MCP endpoints, proxies).

Hostnames are never resolved (a DNS answer can change between the check and the connection): only the
literal ``localhost``, 127.0.0.0/8, ``::1`` and IPv4-mapped loopback addresses count.
"""

from __future__ import annotations

import ipaddress

__all__ = ["is_loopback_host"]


def is_loopback_host(host: str) -> bool:
    """True for ``localhost``, 127.0.0.0/8 and ``::1`` (brackets allowed); hostnames are not resolved."""
    host = host.strip("[]").lower()
    if host == "localhost":
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_loopback
