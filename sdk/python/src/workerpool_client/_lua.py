"""The queue contract's enqueue script, read from the files shipped in this package."""

from __future__ import annotations

import hashlib
from functools import cache
from importlib.resources import files


def _read(name: str) -> str:
    return files(__package__).joinpath("lua", name).read_text(encoding="utf-8")


@cache
def enqueue_script() -> tuple[str, str]:
    """(source, SHA-1) of the enqueue script, composed as the Rust side composes it.

    The script's first line, `-- uses: a.lua, b.lua`, names the files that go
    in front of it, in order (`guard.lua`, `now.lua`): the same list the
    worker's crate composes it from.
    """
    body = _read("enqueue.lua")
    first = body.split("\n", 1)[0]
    pieces = []
    if first.startswith("-- uses:"):
        pieces = [p.strip() for p in first[len("-- uses:"):].split(",") if p.strip()]
    source = "".join(_read(p) for p in pieces) + body
    return source, hashlib.sha1(source.encode("utf-8")).hexdigest()
