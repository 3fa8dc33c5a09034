"""Real parts for the tests: redis-server processes on free ports (plain, TLS, a
3-node cluster), certificates made with openssl, and the workerpool-worker binary.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Optional

import redis

ROOT = Path(__file__).resolve().parents[3]
SDK = ROOT / "sdk" / "python"
SRC = SDK / "src"
APPS = Path(__file__).resolve().parent / "apps"


def eventually(check: Callable[[], object], what: str, timeout: float = 15.0,
               seen: Optional[Callable[[], object]] = None) -> object:
    """Polls `check` until it returns something truthy; fails saying what was seen."""
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            shown = seen() if seen else result
            raise AssertionError(f"timed out after {timeout}s waiting for {what}; saw {shown!r}")
        time.sleep(0.02)


def free_port(bus: bool = False) -> int:
    """A port nothing listens on (and, for a cluster node, its bus port + 10000)."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if not bus:
            return port
        if port + 10000 < 65536:
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", port + 10000))
                except OSError:
                    continue
            return port


def bin_dir() -> Path:
    """Where workerpool-worker and workerpool are, built when missing."""
    path = Path(os.environ.get("WORKERPOOL_BIN_DIR") or ROOT / "target" / "debug")
    if not (path / "workerpool-worker").exists() or not (path / "workerpool").exists():
        if "WORKERPOOL_BIN_DIR" in os.environ:
            raise AssertionError(f"WORKERPOOL_BIN_DIR={path} holds no workerpool-worker and "
                                 f"workerpool binaries")
        # The whole workspace with its examples, as its tests build it: one
        # set of features.
        subprocess.run(["cargo", "build", "--workspace", "--bins", "--examples"],
                       cwd=ROOT, check=True)
    return path


def python_env() -> dict:
    """The environment for a Python handler or adapter: the library from the checkout."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(SRC), str(APPS)])
    return env


class RedisServer:
    """One redis-server in a temp dir, killed by stop()."""

    def __init__(self, *extra: str, tls: Optional[Certs] = None, mutual: bool = False,
                 cluster: bool = False, sentinel_conf: Optional[str] = None) -> None:
        self.dir = tempfile.mkdtemp(prefix="wp-redis-")
        self.tls = tls
        for _ in range(5):
            self.port = free_port(bus=cluster)
            args = ["redis-server"]
            if sentinel_conf is not None:
                # Sentinel rewrites its configuration file: a copy of its own.
                conf = os.path.join(self.dir, f"sentinel-{self.port}.conf")
                Path(conf).write_text(sentinel_conf)
                args += [conf, "--sentinel"]
            args += ["--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                     "--dir", self.dir, "--daemonize", "no"]
            if tls:
                args += ["--port", "0", "--tls-port", str(self.port),
                         "--tls-cert-file", str(tls.server_cert),
                         "--tls-key-file", str(tls.server_key),
                         "--tls-ca-cert-file", str(tls.ca),
                         "--tls-auth-clients", "yes" if mutual else "no"]
            else:
                args += ["--port", str(self.port)]
            if cluster:
                args += ["--cluster-enabled", "yes", "--cluster-node-timeout", "1000",
                         "--cluster-config-file", f"nodes-{self.port}.conf"]
            self.log = open(os.path.join(self.dir, f"redis-{self.port}.log"), "wb")
            self.proc = subprocess.Popen(args + list(extra), stdout=self.log,
                                         stderr=subprocess.STDOUT, cwd=self.dir)
            if self._wait_up():
                return
            self.proc.kill()
            self.proc.wait()
            self.log.close()
        log = self.read_log()
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)
        raise AssertionError(f"redis-server did not start on 5 ports; log: {log}")

    def read_log(self) -> str:
        if not self.log.closed:
            self.log.flush()
        return Path(self.log.name).read_text(errors="replace")[-2000:]

    def _wait_up(self) -> bool:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return False  # most likely the port was taken meanwhile
            try:
                if self.client().ping():
                    return True
            except (redis.AuthenticationError, redis.ResponseError):
                return True  # it answers: up, with a password
            except redis.RedisError:
                time.sleep(0.02)
        return False

    @property
    def url(self) -> str:
        return f"{'rediss' if self.tls else 'redis'}://127.0.0.1:{self.port}"

    def client(self, **kwargs) -> redis.Redis:
        if self.tls:
            kwargs.update(ssl=True, ssl_ca_certs=str(self.tls.ca),
                          ssl_certfile=str(self.tls.client_cert),
                          ssl_keyfile=str(self.tls.client_key))
        return redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=10, **kwargs)

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)


class Cluster:
    """Three redis-server --cluster-enabled nodes joined with redis-cli --cluster create."""

    def __init__(self) -> None:
        self.nodes = [RedisServer(cluster=True) for _ in range(3)]
        try:
            addrs = [f"127.0.0.1:{n.port}" for n in self.nodes]
            out = subprocess.run(["redis-cli", "--cluster", "create", *addrs,
                                  "--cluster-replicas", "0", "--cluster-yes"],
                                 capture_output=True, text=True, timeout=60)
            assert out.returncode == 0, f"redis-cli --cluster create: {out.stdout}{out.stderr}"

            def ok() -> bool:
                for n in self.nodes:
                    info = n.client().execute_command("CLUSTER", "INFO").decode()
                    if "cluster_state:ok" not in info:
                        return False
                return True

            eventually(ok, "every node to see cluster_state:ok", timeout=30)
        except BaseException:
            self.stop()
            raise

    @property
    def url(self) -> str:
        return self.nodes[0].url

    def client(self) -> redis.RedisCluster:
        return redis.RedisCluster(host="127.0.0.1", port=self.nodes[0].port)

    def stop(self) -> None:
        for n in self.nodes:
            n.stop()


class Certs:
    """A CA, a server certificate for 127.0.0.1 / localhost, a client certificate,
    and an unrelated CA, made with openssl in `dir`."""

    def __init__(self, dir: Path) -> None:
        self.dir = dir
        self._ca("ca")
        self._ca("other-ca")
        self._signed("server", "subjectAltName=IP:127.0.0.1,DNS:localhost\n"
                               "extendedKeyUsage=serverAuth\n")
        self._signed("client", "extendedKeyUsage=clientAuth\n")
        self.ca = dir / "ca.crt"
        self.other_ca = dir / "other-ca.crt"
        self.server_cert, self.server_key = dir / "server.crt", dir / "server.key"
        self.client_cert, self.client_key = dir / "client.crt", dir / "client.key"

    _EC = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"]

    def _openssl(self, *args: str) -> None:
        out = subprocess.run(["openssl", *args], cwd=self.dir, capture_output=True, text=True,
                             stdin=subprocess.DEVNULL)
        assert out.returncode == 0, f"openssl {args}: {out.stderr}"

    def _ca(self, name: str) -> None:
        self._openssl("req", "-x509", "-nodes", "-days", "2", *self._EC, "-keyout",
                      f"{name}.key", "-out", f"{name}.crt", "-subj", f"/CN={name}")

    def _signed(self, name: str, ext: str) -> None:
        (self.dir / f"{name}.ext").write_text(ext)
        self._openssl("req", "-nodes", *self._EC, "-keyout", f"{name}.key", "-out",
                      f"{name}.csr", "-subj", f"/CN={name}")
        self._openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
                      "-CAcreateserial", "-days", "2", "-out", f"{name}.crt", "-extfile",
                      f"{name}.ext")


class Worker:
    """A workerpool-worker process; stop() drains it (SIGTERM) and returns its log."""

    def __init__(self, url: str, queues: list, command: list, *, concurrency: int = 1,
                 extra: tuple = (), env: Optional[dict] = None) -> None:
        self.dir = tempfile.mkdtemp(prefix="wp-worker-")
        self.log_path = os.path.join(self.dir, "worker.log")
        self.log = open(self.log_path, "wb")
        args = [str(bin_dir() / "workerpool-worker"), "--redis-url", url,
                "--concurrency", str(concurrency), "--listen", f"127.0.0.1:{free_port()}",
                "--handler", "exec", "--shutdown-timeout", "5s"]
        for q in queues:
            args += ["--queue", q]
        args += list(extra) + ["--", *command]
        self.proc = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT,
                                     env=env or python_env(), stdin=subprocess.DEVNULL)

    def read_log(self) -> str:
        if not self.log.closed:
            self.log.flush()
        return Path(self.log_path).read_text(errors="replace")

    def wait_log(self, *texts: str, timeout: float = 10) -> str:
        """The log once it holds every one of `texts` (a child's stderr reaches it on
        its own, after the answer that settles the job may have), or as it is at
        `timeout`."""
        deadline = time.monotonic() + timeout
        while True:
            log = self.read_log()
            if all(t in log for t in texts) or time.monotonic() > deadline:
                return log
            time.sleep(0.05)

    def stop(self) -> str:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        text = self.read_log()
        shutil.rmtree(self.dir, ignore_errors=True)
        return text

    def __enter__(self) -> Worker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def python_handler(module: str) -> list:
    """The exec command for a handler module of tests/apps (or an example's)."""
    return [sys.executable, "-m", module]


def read_records(path: Path) -> list:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def dead_letters(r: redis.Redis, queue: str) -> list:
    return [json.loads(e) for e in r.lrange(f"{queue}:dead", 0, -1)]
