"""The webhook address policy over a table of addresses: explicit networks, the same answer
on every Python version, and IPv4 addresses carried inside IPv6 addresses unwrapped."""

from __future__ import annotations

import ipaddress

import pytest

from durq import addresses
from durq.webhooks import literal_address

# Addresses a delivery must not reach without the allow-list, each with why.
REFUSED = {
    "127.0.0.1": "loopback",
    "0.0.0.0": "unspecified",
    "10.0.0.7": "private",
    "172.31.255.255": "private",
    "192.168.1.1": "private",
    "100.64.0.1": "shared",
    "169.254.169.254": "link-local, cloud metadata",
    "192.0.0.170": "IETF protocol assignments",
    "192.0.2.1": "documentation",
    "198.18.0.1": "benchmarking",
    "224.0.0.1": "multicast",
    "240.0.0.1": "reserved",
    "255.255.255.255": "broadcast",
    "::1": "loopback",
    "::": "unspecified",
    "fe80::1": "link-local",
    "fec0::1": "site-local",
    "fd00::1": "unique local",
    "ff02::1": "multicast",
    "100::1": "discard-only",
    "2001:db8::1": "documentation",
    "3fff::1": "documentation",
    "2001:2::1": "benchmarking",
    "5f00::1": "segment routing",
    "::ffff:127.0.0.1": "IPv4-mapped loopback",
    "::ffff:169.254.169.254": "IPv4-mapped metadata",
    "::ffff:0:7f00:1": "IPv4-translated loopback",
    "::7f00:1": "IPv4-compatible loopback",
    "::a00:7": "IPv4-compatible private",
    "64:ff9b::a9fe:a9fe": "NAT64 of the metadata address",
    "64:ff9b::7f00:1": "NAT64 of loopback",
    "64:ff9b::a00:7": "NAT64 of a private address (DNS64 of a private A record)",
    "64:ff9b:1::a00:7": "local NAT64, /96 form, private",
    "64:ff9b:1:a00:0:700::": "local NAT64, /48 form (skips the u octet), private",
    "64:ff9b:1:0:a:0:700:0": "local NAT64, /64 form (after the u octet), private",
    "64:ff9b:1:0:ff00::a00:7": "local NAT64 of no RFC 6052 form (a u octet)",
    "64:ff9b:1:5db8:d8:2200::": "local NAT64, /48 form of a public address: its /96 "
    "reading is 0.0.0.0, and the address does not say which one is meant",
    "2002:7f00:1::": "6to4 of loopback",
    "2002:a9fe:a9fe::1": "6to4 of the metadata address",
    "2001:0:5db8:ac10:0:0:80ff:fffe": "Teredo, client 127.0.0.1 (bits inverted)",
    "2001:0:7f00:1:0:0:a2c9:e88c": "Teredo, server 127.0.0.1",
}

PUBLIC = [
    "93.184.216.34",
    "8.8.8.8",
    "1.1.1.1",
    "2606:4700:4700::1111",
    "2a00:1450:4001:80b::200e",
    "::ffff:93.184.216.34",  # IPv4-mapped public
    "64:ff9b::5db8:d822",  # NAT64 of 93.184.216.34
    "64:ff9b:1::5db8:d822",  # local NAT64 (/96) of 93.184.216.34
    "64:ff9b:1:1234:0:5678:5db8:d822",  # a local /96 NAT64 prefix, 93.184.216.34
    "2002:5db8:d822::1",  # 6to4 of 93.184.216.34
    "2001:0:5db8:d822:0:0:a247:27dd",  # Teredo: server and client (93.184.216.34) public
]


@pytest.mark.parametrize("text", sorted(REFUSED))
def test_the_policy_refuses_addresses_of_the_own_network(text: str) -> None:
    address = ipaddress.ip_address(text)
    assert not addresses.is_public(address), REFUSED[text]
    assert not addresses.address_allowed(address)
    # The allow-list opens it, for deliveries inside your own network.
    assert addresses.address_allowed(
        address, [ipaddress.ip_network("0.0.0.0/0"), ipaddress.ip_network("::/0")]
    )


@pytest.mark.parametrize("text", PUBLIC)
def test_the_policy_accepts_public_addresses(text: str) -> None:
    assert addresses.is_public(ipaddress.ip_address(text))
    assert addresses.address_allowed(ipaddress.ip_address(text))


def test_an_allowed_ipv4_network_opens_its_addresses_inside_ipv6() -> None:
    allow = [ipaddress.ip_network("10.0.0.0/8")]
    for text in ("10.0.0.7", "::ffff:10.0.0.7", "64:ff9b::a00:7", "2002:a00:7::"):
        assert addresses.address_allowed(ipaddress.ip_address(text), allow), text
    assert not addresses.address_allowed(ipaddress.ip_address("64:ff9b::7f00:1"), allow)


def test_embedded_addresses_unwrap_every_known_form() -> None:
    def carried(text: str) -> set[str]:
        return {str(a) for a in addresses.embedded_ipv4(ipaddress.IPv6Address(text))}

    assert carried("::ffff:127.0.0.1") == {"127.0.0.1"}
    assert carried("::ffff:0:7f00:1") == {"127.0.0.1"}
    assert carried("::7f00:1") == {"127.0.0.1"}
    assert carried("64:ff9b::a9fe:a9fe") == {"169.254.169.254"}
    assert carried("2002:7f00:1::") == {"127.0.0.1"}
    assert carried("2001:0:5db8:ac10:0:0:80ff:fffe") == {"93.184.172.16", "127.0.0.1"}
    assert "10.0.0.7" in carried("64:ff9b:1:a00:0:700::")  # /48: skips the u octet
    assert "10.0.0.7" in carried("64:ff9b:1:0:a:0:700:0")  # /64: after the u octet
    assert carried("64:ff9b:1::5db8:d822") == {"93.184.216.34"}  # the only reading
    assert carried("64:ff9b:1:0:ff00::a00:7") == set()  # a u octet: no RFC 6052 form
    assert carried("2606:4700:4700::1111") == set()


@pytest.mark.parametrize(
    "host",
    ["[64:ff9b::7f00:1]", "[::ffff:0:7f00:1]", "[2002:7f00:1::]", "[::7f00:1]", "[::1%25lo]"],
)
def test_literal_hosts_in_ipv6_are_read_and_refused(host: str) -> None:
    address = literal_address(host.replace("%25", "%"))
    assert address is not None and not addresses.address_allowed(address)


def test_the_policy_does_not_lean_on_python_s_own_classification() -> None:
    """``is_private``/``is_global`` changed between 3.11.x, 3.12.x and 3.13: the policy's
    networks are its own, so its answers are the same on every Python."""
    import inspect

    from durq import webhooks

    for module in (addresses, webhooks):
        source = inspect.getsource(module)
        for name in ("is_private", "is_global", "is_reserved", "is_loopback", "is_link_local"):
            assert f".{name}" not in source, (module.__name__, name)
