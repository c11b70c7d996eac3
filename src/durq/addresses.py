"""The webhook address policy: which IP addresses a delivery may connect to.

A delivery may reach a *public* address, or one on the allow-list. The refused networks are
written out here (IANA's special-purpose registries), not taken from ``ipaddress``'s
``is_private``/``is_global``, whose answers changed between Python patch releases.

An IPv6 address that carries an IPv4 address reaches that IPv4 host (IPv4-mapped, a NAT64
prefix behind DNS64, 6to4, Teredo, IPv4-compatible, IPv4-translated): the IPv4 address is
unwrapped and must pass the IPv4 policy, so ``[64:ff9b::a9fe:a9fe]`` is refused like
``169.254.169.254``. A local-use NAT64 address (``64:ff9b:1::/48``) does not say how long
its prefix is: every RFC 6052 reading of it must be public, which in practice admits the
``/96`` prefixes only (put a shorter one on the allow-list as an IPv6 network).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
Address = ipaddress.IPv4Address | ipaddress.IPv6Address

V4 = ipaddress.IPv4Network
V6 = ipaddress.IPv6Network

#: IPv4 networks that are not public (RFC 6890 and its updates).
REFUSED_V4: tuple[ipaddress.IPv4Network, ...] = (
    V4("0.0.0.0/8"),  # "this network", unspecified
    V4("10.0.0.0/8"),  # private
    V4("100.64.0.0/10"),  # shared address space (carrier-grade NAT)
    V4("127.0.0.0/8"),  # loopback
    V4("169.254.0.0/16"),  # link-local, cloud metadata
    V4("172.16.0.0/12"),  # private
    V4("192.0.0.0/24"),  # IETF protocol assignments
    V4("192.0.2.0/24"),  # documentation
    V4("192.88.99.0/24"),  # 6to4 relay anycast (deprecated)
    V4("192.168.0.0/16"),  # private
    V4("198.18.0.0/15"),  # benchmarking
    V4("198.51.100.0/24"),  # documentation
    V4("203.0.113.0/24"),  # documentation
    V4("224.0.0.0/4"),  # multicast
    V4("240.0.0.0/4"),  # reserved, and the broadcast address
)

#: Only global unicast IPv6 addresses can be public ...
GLOBAL_UNICAST_V6 = V6("2000::/3")
#: ... and within it these are not (outside it: loopback, unspecified, unique-local,
#: link-local, site-local, multicast, discard-only, segment-routing SIDs).
REFUSED_V6: tuple[ipaddress.IPv6Network, ...] = (
    V6("2001::/23"),  # IETF protocol assignments (Teredo, 2001::/32, is unwrapped first)
    V6("2001:db8::/32"),  # documentation
    V6("3fff::/20"),  # documentation
)

# Prefixes whose addresses carry an IPv4 address.
_MAPPED = V6("::ffff:0:0/96")  # IPv4-mapped
_TRANSLATED = V6("::ffff:0:0:0/96")  # IPv4-translated (SIIT)
_COMPATIBLE = V6("::/96")  # IPv4-compatible (deprecated), also :: and ::1
_NAT64 = V6("64:ff9b::/96")  # the well-known NAT64 prefix
_NAT64_LOCAL = V6("64:ff9b:1::/48")  # local-use NAT64 prefixes, of any RFC 6052 length
_6TO4 = V6("2002::/16")
_TEREDO = V6("2001::/32")


def _v4(bits: int) -> ipaddress.IPv4Address:
    return ipaddress.IPv4Address(bits & 0xFFFFFFFF)


def _rfc6052(value: int, prefix_len: int) -> ipaddress.IPv4Address | None:
    """The IPv4 address an RFC 6052 prefix of ``prefix_len`` bits embeds in ``value`` (its
    32 bits follow the prefix, skipping bits 64-71, the "u" octet), or ``None`` when the
    address is not of that form (the u octet or the bits after the IPv4 address not zero)."""
    if (value >> 56) & 0xFF:
        return None
    bits = [(value >> (127 - i)) & 1 for i in range(prefix_len, 128) if not 64 <= i < 72]
    out = 0
    for b in bits[:32]:
        out = out << 1 | b
    return ipaddress.IPv4Address(out) if not any(bits[32:]) else None


def embedded_ipv4(address: ipaddress.IPv6Address) -> list[ipaddress.IPv4Address]:
    """The IPv4 addresses an IPv6 address leads to (none for a plain IPv6 address).

    A local-use NAT64 address gives one candidate per RFC 6052 prefix length it can be
    read with (48, 56, 64 or 96 bits: which one the network uses is not written in the
    address); Teredo gives its server and its client (the bitwise NOT of the last 32
    bits)."""
    value = int(address)
    low = _v4(value)
    if address in _MAPPED or address in _TRANSLATED or address in _COMPATIBLE:
        return [low]
    if address in _NAT64:
        return [low]
    if address in _NAT64_LOCAL:
        readings = (_rfc6052(value, n) for n in (48, 56, 64, 96))
        return [v4 for v4 in readings if v4 is not None]
    if address in _6TO4:
        return [_v4(value >> 80)]
    if address in _TEREDO:
        return [_v4(value >> 64), _v4(~value)]
    return []


def is_public(address: Address) -> bool:
    """Whether ``address`` is public: not in a refused network, and, for an IPv6 address
    carrying IPv4 addresses, each of them public."""
    if isinstance(address, ipaddress.IPv4Address):
        return not any(address in net for net in REFUSED_V4)
    carried = embedded_ipv4(address)
    if carried:
        return all(is_public(v4) for v4 in carried)
    return address in GLOBAL_UNICAST_V6 and not any(address in net for net in REFUSED_V6)


def address_allowed(address: Address, allow: Sequence[Network] = ()) -> bool:
    """Whether a delivery may connect to ``address``: it is public, or on the allow-list
    as written, or every IPv4 address it carries is public or on the allow-list."""

    def listed(a: Address) -> bool:
        return any(a in net for net in allow if net.version == a.version)

    if listed(address):
        return True
    if isinstance(address, ipaddress.IPv6Address):
        carried = embedded_ipv4(address)
        if carried:
            return all(listed(v4) or is_public(v4) for v4 in carried)
    return is_public(address)
