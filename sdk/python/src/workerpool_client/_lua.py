"""The queue contract's Lua scripts, read from the files shipped in this package
(copied byte for byte from the queue crate's queue/src/lua by
scripts/sync-sdk-lua.sh)."""

from __future__ import annotations

import hashlib
from functools import cache
from importlib.resources import files


def _read(name: str) -> str:
    return files(__package__).joinpath("lua", name).read_text(encoding="utf-8")


def pieces(name: str) -> list[str]:
    """The pieces script `name` names on its first line (`-- uses: a.lua, b.lua
    as f(args)`), in order, as written."""
    first = _read(name).split("\n", 1)[0]
    if not first.startswith("-- uses:"):
        return []
    return [p.strip() for p in first[len("-- uses:"):].split(",") if p.strip()]


def compose(name: str) -> str:
    """The whole source of script `name`, composed as the Rust side composes it:
    each piece its first line names, in order (a piece written `file.lua as
    f(args)` wrapped as `local function f(args)` ... `end`), then the script."""
    source = ""
    for piece in pieces(name):
        file, sep, function = piece.partition(" as ")
        if sep:
            source += f"local function {function.strip()}\n{_read(file.strip())}\nend\n"
        else:
            source += _read(piece)
    return source + _read(name)


@cache
def script(name: str) -> tuple[str, str]:
    """(source, SHA-1) of script `name` (`enqueue.lua`, `cancel.lua`): the same
    script, and so the same SHA-1, as the worker's crate loads."""
    source = compose(name)
    return source, hashlib.sha1(source.encode("utf-8")).hexdigest()


def enqueue_script() -> tuple[str, str]:
    """(source, SHA-1) of the enqueue script."""
    return script("enqueue.lua")


def cancel_script() -> tuple[str, str]:
    """(source, SHA-1) of the cancel script."""
    return script("cancel.lua")
