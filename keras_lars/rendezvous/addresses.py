"""The addresses of keras_lars.rendezvous: "host:port", the host to bind,
and whether something listens there."""

import ipaddress
import socket


def split_address(address):
    """(host, port) of "host:port" ("[::1]:port" for IPv6); ValueError if malformed."""
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit() or not port.isascii() or not 0 < int(port) < 65536:
        raise ValueError(f"{address!r} is not host:port")
    return host.strip("[]"), int(port)


def accepts_connections(address, seconds=1.0):
    """Whether something accepts TCP connections at "host:port"."""
    try:
        socket.create_connection(split_address(address), timeout=seconds).close()
        return True
    except OSError:
        return False


def _family(host):
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def listen_host(host):
    """The host to bind for the configured `host`: itself, except a name
    other than "localhost" that resolves here to loopback addresses only
    (Debian's /etc/hosts maps the machine's own name to 127.0.1.1, while
    its peers reach it at its network address): then every interface, as
    TensorFlow's and JAX's own servers bind."""
    try:
        ipaddress.ip_address(host)
        return host
    except ValueError:
        pass
    try:
        found = {info[4][0] for info in socket.getaddrinfo(host, None)}
    except OSError:
        return host  # the bind names it
    if host != "localhost" and found and all(ipaddress.ip_address(a).is_loopback for a in found):
        return ""
    return host
