"""The wheel and the sdist carry the Lua scripts, contract.json and py.typed, and the wheel
works installed."""

from __future__ import annotations

import subprocess
import sys
import tarfile
import zipfile

from support import ROOT, SDK

import workerpool_client


def test_wheel_and_sdist_hold_the_lua_scripts_and_work_installed(tmp_path, redis_server, r,
                                                                 queue):
    out = subprocess.run([sys.executable, "-m", "build", "--no-isolation", "--wheel", "--sdist",
                          "--outdir", str(tmp_path), str(SDK)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    version = workerpool_client.__version__
    wheel = tmp_path / f"workerpool_client-{version}-py3-none-any.whl"
    sdist = tmp_path / f"workerpool_client-{version}.tar.gz"
    names = set(zipfile.ZipFile(wheel).namelist())
    for name in ("guard.lua", "now.lua", "enqueue.lua"):
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
    assert f"workerpool_client-{version}/src/workerpool_client/lua/enqueue.lua" in members
    assert f"workerpool_client-{version}/src/workerpool_client/contract.json" in members

    # Installed from the wheel (no checkout on the path), it finds its scripts and
    # the contract's facts (keep is checked against the longest).
    target = tmp_path / "site"
    out = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
                          "--target", str(target), str(wheel)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    code = ("import sys, workerpool_client as w; print(w.__file__); "
            f"c = w.Client({redis_server.url!r}); "
            f"print(c.enqueue({queue!r}, 't', unique_key='k', keep=60)); "
            f"print(c.status({queue!r}, 'x')); c.close()")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={"PYTHONPATH": str(target), "PATH": "/usr/bin:/bin"}, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    path, job_id, status = out.stdout.split()
    assert status == "None"
    assert path.startswith(str(target))
    assert r.hget(f"{queue}:unique", "k").decode() == job_id


def test_the_packaged_scripts_are_the_queues_own():
    # scripts/sync-sdk-lua.sh copies them; a change to queue/src/lua without a copy fails here.
    lua = SDK / "src" / "workerpool_client" / "lua"
    for name in ("guard.lua", "now.lua", "enqueue.lua"):
        assert (lua / name).read_bytes() == (ROOT / "queue/src/lua" / name).read_bytes(), name
