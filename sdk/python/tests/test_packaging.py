"""The wheel and the sdist carry the Lua scripts, contract.json and py.typed, and the wheel
works installed."""

from __future__ import annotations

import hashlib
import subprocess
import sys
import tarfile
import zipfile

from support import ROOT, SDK

import workerpool_client

# The scripts the clients run, and every piece they use.
RUN = ("enqueue.lua", "cancel.lua")
SHIPPED = ("enqueue.lua", "cancel.lua", "guard.lua", "now.lua", "outcome.lua", "unique.lua")


def test_wheel_and_sdist_hold_the_lua_scripts_and_work_installed(tmp_path, redis_server, r,
                                                                 queue):
    out = subprocess.run([sys.executable, "-m", "build", "--no-isolation", "--wheel", "--sdist",
                          "--outdir", str(tmp_path), str(SDK)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    version = workerpool_client.__version__
    wheel = tmp_path / f"workerpool_client-{version}-py3-none-any.whl"
    sdist = tmp_path / f"workerpool_client-{version}.tar.gz"
    names = set(zipfile.ZipFile(wheel).namelist())
    for name in SHIPPED:
        member = f"workerpool_client/lua/{name}"
        assert member in names, sorted(names)
        # Byte for byte the queue's own script.
        assert zipfile.ZipFile(wheel).read(member) == (ROOT / "queue/src/lua" / name).read_bytes()
    assert "workerpool_client/py.typed" in names
    member = "workerpool_client/contract.json"
    assert zipfile.ZipFile(wheel).read(member) == (
        SDK / "src" / "workerpool_client" / "contract.json").read_bytes()
    meta = zipfile.ZipFile(wheel).read(f"workerpool_client-{version}.dist-info/METADATA").decode()
    assert "Requires-Dist: redis<8,>=4.6" in meta and "Requires-Python: >=3.9" in meta
    with tarfile.open(sdist) as tar:
        members = tar.getnames()
    for name in SHIPPED:
        assert f"workerpool_client-{version}/src/workerpool_client/lua/{name}" in members
    assert f"workerpool_client-{version}/src/workerpool_client/contract.json" in members

    # Installed from the wheel (no checkout on the path), it finds its scripts and
    # the contract's facts (keep is checked against the longest).
    target = tmp_path / "site"
    out = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
                          "--target", str(target), str(wheel)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    code = ("import sys, workerpool_client as w; print(w.__file__); "
            f"c = w.Client({redis_server.url!r}); "
            f"i = c.enqueue({queue!r}, 't', unique_key='k', keep=60); print(i); "
            f"print(c.status({queue!r}, 'x')); print(c.cancel({queue!r}, i)['did']); "
            f"c.close()")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={"PYTHONPATH": str(target), "PATH": "/usr/bin:/bin"}, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    path, job_id, status, did = out.stdout.split()
    assert status == "None" and did == "removed"
    assert path.startswith(str(target))
    # The cancel freed the unique key the enqueue took.
    assert r.hget(f"{queue}:unique", "k") is None
    assert r.hget(f"{queue}:job:{job_id}", "state") == b"cancelled"


def test_the_packaged_scripts_are_the_queues_own_and_cover_what_they_use():
    # scripts/sync-sdk-lua.sh copies them; a change to queue/src/lua without a copy fails here.
    lua = SDK / "src" / "workerpool_client" / "lua"
    assert sorted(p.name for p in lua.iterdir()) == sorted(SHIPPED)
    for name in SHIPPED:
        assert (lua / name).read_bytes() == (ROOT / "queue/src/lua" / name).read_bytes(), (
            f"{name} differs from queue/src/lua/{name}: run scripts/sync-sdk-lua.sh")
    for script in RUN:
        first = (ROOT / "queue/src/lua" / script).read_text().split("\n", 1)[0]
        assert first.startswith("-- uses: ")
        for piece in first[len("-- uses: "):].split(","):
            name = piece.strip().split(" as ")[0]
            assert name in SHIPPED, f"{script} uses {name}, which the package does not ship"


def test_scripts_compose_as_the_queue_crate_composes_them():
    from workerpool_client import _lua

    for script in RUN:
        source, sha = _lua.script(script)
        text = (ROOT / "queue/src/lua" / script).read_text()
        first = text.split("\n", 1)[0]
        pieces = [p.strip() for p in first[len("-- uses: "):].split(",")]
        expected = "".join((ROOT / "queue/src/lua" / p).read_text() for p in pieces) + text
        assert source == expected
        assert sha == hashlib.sha1(expected.encode()).hexdigest()
