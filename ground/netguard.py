"""Where a workspace's tool may connect: never the cloud metadata service or the platform's
own internals.

A tool's URL is the workspace's data (an HTTP template, an OpenAPI server, an MCP server),
so on a shared platform it is checked like any untrusted input:

* always refused: link-local (169.254.0.0/16 with the metadata service 169.254.169.254,
  fe80::/10), unspecified (0.0.0.0, ::), multicast and broadcast addresses, also when
  wrapped in IPv6 (IPv4-mapped, NAT64, 6to4);
* refused when the operator sets ``AGENTRUN_TOOL_PRIVATE_NETWORKS=deny``: loopback and the
  private ranges (10/8, 172.16/12, 192.168/16, fc00::/7, 127/8, ::1, ...). The default is
  ``allow``: self-hosted providers and the sandbox servers live there. Any other value
  counts as ``deny`` (a typo fails closed).

A host is read as a WHATWG URL parser reads it (`ada-url`, the parser behind Node's URL) before
it is judged: the numeric IPv4 spellings that browsers and C's inet_aton accept (`2852039166`,
`0251.0376.0251.0376`, `0xa9.0xfe.0xa9.0xfe`, `127.1`, `0`) are the addresses they spell and
are refused by the same rule as the dotted form; a host that ends in a number but spells no
IPv4 address (`1.2.3.4.5`, `09`) is refused too, the standard makes such a URL invalid.

The check runs when a definition is saved (`literal_refusal`: a URL whose host is a
literal address) and at every connection (`GuardedResolver` for the executor's aiohttp
tool client, with `refuse_literal` for a literal address, which aiohttp connects to
without asking a resolver; `GuardedBackend` for httpx, the MCP SDK's): the host name is resolved,
each address checked, and the connection made to a checked address, so a name that
resolves differently the second time (DNS rebinding) cannot slip through. TLS still
verifies, and SNI and Host still name, the host of the URL. A refusal names the host only,
never the addresses it resolved to.

Used by the executor (tool calls) and the control plane (asking an MCP server for its
tools). Stdlib, anyio and aiohttp's resolver interface: no control-plane import.
"""

from __future__ import annotations

import ipaddress
import os
import socket
from collections.abc import Iterable
from typing import Any

import ada_url
import anyio
from aiohttp.abc import AbstractResolver, ResolveResult
from aiohttp.resolver import ThreadedResolver

ENV = "AGENTRUN_TOOL_PRIVATE_NETWORKS"
IpAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_BROADCAST = ipaddress.ip_address("255.255.255.255")


class DestinationRefused(Exception):
    """A tool's host is not one tools may reach (the message names the host only)."""

    def __init__(self, host: str) -> None:
        super().__init__(
            f"the host {host!r} is not reachable for tools: it resolves to a link-local, "
            "multicast or unspecified address, or to a private or loopback one this "
            f"platform refuses ({ENV})"
        )
        self.host = host


def private_denied() -> bool:
    """Whether the operator refuses private and loopback addresses (default: allowed)."""
    return os.environ.get(ENV, "allow").strip().lower() not in ("", "allow")


def _unwrapped(ip: IpAddress) -> IpAddress:
    """The IPv4 address an IPv6 one carries (mapped, NAT64, 6to4), else itself."""
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return ip.ipv4_mapped
        if ip in _NAT64:
            return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
        if ip.sixtofour is not None:
            return ip.sixtofour
    return ip


def refused(ip: IpAddress) -> bool:
    """Whether a tool may not connect to `ip` under the current policy."""
    ip = _unwrapped(ip)
    if ip.is_link_local or ip.is_unspecified or ip.is_multicast or ip == _BROADCAST:
        return True
    return private_denied() and (ip.is_private or ip.is_loopback)


class NotAHost(ValueError):
    """A host no URL may name: it ends in a number but spells no IPv4 address, or holds a
    character no host may (the WHATWG URL standard's host parser fails on it)."""


# Characters that end a host in a URL: a string holding one is not a host on its own.
_DELIMITERS = frozenset("/\\?#@")


def address_of(host: str) -> IpAddress | None:
    """The address a URL's host spells, in any of its spellings (`[::1]`, `169.254.169.254`,
    `2852039166`, `0xa9.0xfe.0xa9.0xfe`, `127.1`), or None for a name; NotAHost when a URL
    parser would refuse the host."""
    bare = host.strip("[]").split("%", 1)[0]
    try:
        return ipaddress.ip_address(bare)
    except ValueError:
        pass
    if ":" in bare or _DELIMITERS.intersection(bare):
        return None  # not an IPv4 spelling; the URL's own parser judged its form
    try:
        parsed = ada_url.URL(f"http://{bare}/").hostname
    except ValueError:
        raise NotAHost(host) from None
    try:
        return ipaddress.ip_address(parsed)
    except ValueError:
        return None  # a name


def canonical_host(host: str) -> str:
    """The host as it is connected to: the dotted form of a numeric IPv4 spelling (as a
    browser sends it), anything else unchanged. Call it on a host refuse_literal let pass."""
    ip = address_of(host)
    return str(ip) if isinstance(ip, ipaddress.IPv4Address) else host


def literal_refusal(host: str | None) -> str | None:
    """For a save-time check: why a URL's host, when it is a literal address in any spelling,
    is refused (None for a name, or an address tools may reach)."""
    if not host:
        return None
    try:
        ip = address_of(host)
    except NotAHost:
        return "has a host that is neither a name nor an address (WHATWG URL host parsing)"
    if ip is None or not refused(ip):
        return None
    if private_denied() and (_unwrapped(ip).is_private or _unwrapped(ip).is_loopback):
        return f"may not point at a private or loopback address ({ENV}=deny)"
    return "may not point at a link-local, multicast or unspecified address"


async def allowed_addresses(host: str, port: int) -> list[str]:
    """The addresses of `host` a tool may connect to, in resolver order; DestinationRefused
    when it has none (OSError when it does not resolve)."""
    refuse_literal(host)  # a numeric spelling is judged as the address it spells
    infos = await anyio.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    found = list(dict.fromkeys(str(info[4][0]) for info in infos))
    allowed = [a for a in found if not refused(ipaddress.ip_address(a.split("%", 1)[0]))]
    if not allowed:
        raise DestinationRefused(host)
    return allowed


def refuse_literal(host: str | None) -> None:
    """At call time: DestinationRefused when the URL's host is a literal address tools may
    not reach (a name is left to the resolver)."""
    if literal_refusal(host) is not None:
        raise DestinationRefused(str(host))


class GuardedResolver(AbstractResolver):
    """An aiohttp resolver that answers only with the addresses a tool may connect to.

    The connector connects to what it answers (the URL's name still goes into TLS
    verification, SNI and Host); DestinationRefused when the name has no such address.
    Make the connector with `use_dns_cache=False`, so every new connection asks again."""

    def __init__(self) -> None:
        self._inner = ThreadedResolver()

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        refuse_literal(host)  # a numeric spelling is judged as the address it spells
        found = await self._inner.resolve(host, port, family)
        allowed = [r for r in found if not refused(ipaddress.ip_address(r["host"].split("%")[0]))]
        if not allowed:
            raise DestinationRefused(host)
        return allowed

    async def close(self) -> None:
        await self._inner.close()


class GuardedBackend:
    """An httpcore (or httpcore2) network backend that connects only to allowed addresses.

    Wraps the pool's own backend: `connect_tcp` resolves and checks the host, then has the
    wrapped backend connect to the checked address; the pool still starts TLS with the
    URL's host as server name, and the request's Host header is untouched."""

    def __init__(self, inner: Any, connect_error: type[Exception]) -> None:
        self._inner = inner
        self._connect_error = connect_error

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,  # noqa: ASYNC109
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> Any:
        try:
            with anyio.fail_after(timeout):
                addresses = await allowed_addresses(host, port)
        except (OSError, TimeoutError) as exc:
            raise self._connect_error(f"{host!r} did not resolve ({type(exc).__name__})") from exc
        last: Exception | None = None
        for address in addresses:
            try:
                return await self._inner.connect_tcp(
                    address,
                    port,
                    timeout=timeout,
                    local_address=local_address,
                    socket_options=socket_options,
                )
            except self._connect_error as exc:
                last = exc
        assert last is not None
        raise last

    def __getattr__(self, name: str) -> Any:  # connect_unix_socket, sleep
        return getattr(self._inner, name)


def guard(transport: Any, connect_error: type[Exception]) -> Any:
    """`transport` (an httpx or httpx2 HTTP transport) with its pool's connections guarded."""
    pool = transport._pool  # noqa: SLF001 - the pool keeps its backend here (pinned versions)
    pool._network_backend = GuardedBackend(pool._network_backend, connect_error)  # noqa: SLF001
    return transport
