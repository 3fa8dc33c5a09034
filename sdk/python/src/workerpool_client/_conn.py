"""The Redis URL forms and TLS options the worker takes, turned into redis-py settings.

Parsing only; the clients connect. The forms are those of the worker's
`--redis-url`: redis://, rediss://, redis+sentinel:// and rediss+sentinel://.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Any, Optional
from urllib.parse import parse_qs, unquote, urlsplit

from .errors import ConfigError

SENTINEL_PORT = 26379
_PRIMARY_NAME = re.compile(r"^[A-Za-z0-9._-]+$")
_FORMS = (
    "redis://[user:password@]host[:port][/db], rediss://… for TLS, "
    "redis+sentinel://[[user]:password@]host1[:26379][,host2…]/<primary name>[/<db>] "
    "or rediss+sentinel://…"
)


def redact(url: str) -> str:
    """The URL with its passwords replaced by ***, for messages."""
    url = re.sub(r"(://[^:@/]*:)[^@/]*@", r"\1***@", url)
    return re.sub(r"(sentinel_password=)[^&]*", r"\1***", url)


@dataclass
class Endpoint:
    """Where Redis is and how to reach it."""

    url: str
    redacted: str
    tls: bool
    sentinel: bool
    cluster: Optional[bool]  # None: ask the server (INFO cluster)
    tls_kwargs: dict = field(default_factory=dict)
    # Sentinel only:
    sentinels: list = field(default_factory=list)
    primary: str = ""
    db: int = 0
    username: Optional[str] = None
    password: Optional[str] = None
    sentinel_kwargs: dict = field(default_factory=dict)


def _readable(path: Any, option: str) -> str:
    if not isinstance(path, (str, os.PathLike)):
        raise ConfigError(f"{option} must be a path to a PEM file, got {type(path).__name__}")
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise ConfigError(f"{option} file {path!r} does not exist or is not a file")
    return path


def _sentinel_hosts(hosts: str, redacted: str) -> list:
    out = []
    for part in hosts.split(","):
        part = part.strip()
        if not part:
            raise ConfigError(f"empty sentinel address in {redacted}: list host[:port] "
                              f"separated by commas")
        if part.startswith("["):
            end = part.find("]")
            if end < 0:
                raise ConfigError(f"unclosed '[' in sentinel address {part!r} of {redacted}")
            host, rest = part[1:end], part[end + 1 :]
            port_text = rest[1:] if rest.startswith(":") else ""
            if rest and not rest.startswith(":"):
                raise ConfigError(f"bad sentinel address {part!r} in {redacted}")
        else:
            host, _, port_text = part.partition(":")
        if not host:
            raise ConfigError(f"sentinel address {part!r} of {redacted} has no host")
        port = SENTINEL_PORT
        if port_text:
            if not port_text.isdigit() or not 0 < int(port_text) < 65536:
                raise ConfigError(f"sentinel address {part!r} of {redacted} has a bad port "
                                  f"{port_text!r}")
            port = int(port_text)
        out.append((host, port))
    return out


def parse(url: Any, *, ca: Any = None, cert: Any = None, key: Any = None,
          insecure_skip_verify: bool = False, cluster: Optional[bool] = None) -> Endpoint:
    """An Endpoint for the URL and options, or ConfigError saying what to fix."""
    if not isinstance(url, str) or not url:
        raise ConfigError(f"the Redis URL must be a non-empty string ({_FORMS})")
    redacted = redact(url)
    scheme, sep, _ = url.partition("://")
    if not sep or scheme not in ("redis", "rediss", "redis+sentinel", "rediss+sentinel"):
        raise ConfigError(f"unsupported Redis URL {redacted}: use {_FORMS}")
    if cluster not in (None, True, False):
        raise ConfigError(f"cluster must be True, False or None (ask the server), "
                          f"got {cluster!r}")
    tls = scheme.startswith("rediss")
    sentinel = scheme.endswith("+sentinel")
    if not tls and (ca or cert or key or insecure_skip_verify):
        given = [n for n, v in (("ca", ca), ("cert", cert), ("key", key),
                                ("insecure_skip_verify", insecure_skip_verify)) if v]
        raise ConfigError(f"{', '.join(given)} given with a plain {scheme}:// URL; TLS options "
                          f"need rediss:// (or rediss+sentinel://), or leave them out")
    if bool(cert) != bool(key):
        raise ConfigError("a client certificate needs both cert= and key= (mutual TLS)")
    if sentinel and cluster:
        raise ConfigError(f"a Sentinel URL ({redacted}) is never a Redis Cluster: leave out "
                          f"cluster=True")
    tls_kwargs: dict = {}
    if tls:
        tls_kwargs["ssl_cert_reqs"] = "none" if insecure_skip_verify else "required"
        tls_kwargs["ssl_check_hostname"] = not insecure_skip_verify
        if ca:
            tls_kwargs["ssl_ca_certs"] = _readable(ca, "ca")
        if cert:
            tls_kwargs["ssl_certfile"] = _readable(cert, "cert")
            tls_kwargs["ssl_keyfile"] = _readable(key, "key")
    endpoint = Endpoint(url=url, redacted=redacted, tls=tls, sentinel=sentinel,
                        cluster=False if sentinel else cluster, tls_kwargs=tls_kwargs)
    if not sentinel:
        try:
            parts = urlsplit(url)
            parts.port  # noqa: B018 - raises on a bad port
        except ValueError as e:
            raise ConfigError(f"bad Redis URL {redacted}: {e}") from None
        if not parts.hostname:
            raise ConfigError(f"Redis URL {redacted} names no host: use {_FORMS}")
        return endpoint
    # redis+sentinel://[[user]:password@]hosts/<primary>[/<db>][?sentinel_password=…]
    rest = url[len(scheme) + 3 :]
    rest, _, query = rest.partition("?")
    netloc, slash, path = rest.partition("/")
    creds, at, hosts = netloc.rpartition("@")
    if at:
        user, colon, password = creds.partition(":")
        endpoint.username = unquote(user) or None
        endpoint.password = unquote(password) if colon else None
    endpoint.sentinels = _sentinel_hosts(hosts, redacted)
    segments = [s for s in path.split("/")] if slash else []
    if not segments or not segments[0]:
        raise ConfigError(f"Sentinel URL {redacted} names no primary: add /<primary name>, "
                          f"for example /mymaster")
    if len(segments) > 2:
        raise ConfigError(f"Sentinel URL {redacted} has too many path segments: "
                          f"/<primary name>[/<db>]")
    endpoint.primary = unquote(segments[0])
    if not _PRIMARY_NAME.match(endpoint.primary):
        raise ConfigError(f"primary name {endpoint.primary!r} of {redacted} may hold only "
                          f"letters, digits, '-', '_' and '.'")
    if len(segments) == 2 and segments[1]:
        if not segments[1].isdigit():
            raise ConfigError(f"database {segments[1]!r} of {redacted} must be a number")
        endpoint.db = int(segments[1])
    params = parse_qs(query, keep_blank_values=True)
    unknown = [k for k in params if k not in ("sentinel_password", "sentinel_username")]
    if unknown:
        raise ConfigError(f"unknown parameter {unknown[0]!r} in {redacted}: a Sentinel URL "
                          f"takes sentinel_password and sentinel_username")
    sentinel_kwargs: dict = {"ssl": True, **tls_kwargs} if tls else {}
    if "sentinel_password" in params:
        sentinel_kwargs["password"] = params["sentinel_password"][-1]
    if "sentinel_username" in params:
        sentinel_kwargs["username"] = params["sentinel_username"][-1]
    endpoint.sentinel_kwargs = sentinel_kwargs
    return endpoint


def primary_kwargs(endpoint: Endpoint) -> dict:
    """What master_for() needs besides the name: the primary's credentials, db and TLS."""
    kwargs: dict = {"db": endpoint.db}
    if endpoint.username is not None:
        kwargs["username"] = endpoint.username
    if endpoint.password is not None:
        kwargs["password"] = endpoint.password
    if endpoint.tls:
        kwargs["ssl"] = True
        kwargs.update(endpoint.tls_kwargs)
    return kwargs
