"""A real tritonserver on this machine: the binary NVIDIA's nvidia-pytriton wheel ships (with the
python backend only: no onnxruntime, openvino or tensorrt backend), fetched from PyPI once into lto's
cache (pinned version, sha256 checked), started on a model repository and stopped.

It runs on CPU-only machines. The python backend's stub embeds the system's libpython of the same
minor version and ignores PYTHONPATH: lto's model.py reads $LTO_PYTHONPATH instead, and lto's tests
and benchmarks pass this interpreter's sys.path there. Nothing here is needed to export a repository.
"""

from __future__ import annotations

import hashlib
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import zipfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from optimize.errors import BackendUnavailable
from optimize.files import cache_root

VERSION = "0.7.0"
# The wheels by machine, with their sha256 (checked before anything is unpacked).
WHEELS = {
    "x86_64": (
        "nvidia_pytriton-0.7.0-py3-none-manylinux_2_35_x86_64.whl",
        "21f063ff93bb426d0c06b7a55e7eb9efcfe62c0dddd9a908e9877e18710128df",
    ),
    "aarch64": (
        "nvidia_pytriton-0.7.0-py3-none-manylinux_2_35_aarch64.whl",
        "f99e07ee56fe065337453956afba17d2673e02ec6a632c3de26ce6e7b32a0898",
    ),
}
# The python backend's stub is built against NumPy 1.x: a tensor made with NumPy 2 reaches Triton
# empty ("output tensor shape does not match size of output"). Its models get this NumPy first on
# their path (lto's runtimes, built against NumPy 2, run with it). By (Python, machine), with sha256.
STUB_NUMPY = "numpy==1.26.4"
STUB_NUMPY_WHEELS = {
    ("3.11", "x86_64"): "666dbfb6ec68962c033a450943ded891bed2d54e6755e35e5835d63f4f6931d5",
}
_START_TIMEOUT_S = 120.0
_STOP_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class Install:
    root: Path  # the unpacked wheel

    @property
    def binary(self) -> Path:
        return self.root / "pytriton" / "tritonserver" / "bin" / "tritonserver"

    @property
    def backends(self) -> Path:
        return self.root / "pytriton" / "tritonserver" / "backends"

    @property
    def stubs(self) -> Path:
        return self.root / "pytriton" / "tritonserver" / "python_backend_stubs"


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while block := fh.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def install(cache: Path | None = None) -> Install:
    """The unpacked wheel in lto's cache, fetched with pip (no dependencies) the first time.
    Raises BackendUnavailable, with the reason, where it cannot be had."""
    machine = platform.machine()
    if sys.platform != "linux" or machine not in WHEELS:
        raise BackendUnavailable(
            f"tritonserver wheels exist for Linux x86_64 and aarch64, not {sys.platform} {machine}"
        )
    wheel_name, sha256 = WHEELS[machine]
    root = (cache or cache_root()) / "tritonserver" / f"{VERSION}-{machine}"
    found = Install(root)
    if found.binary.is_file():
        return found
    with tempfile.TemporaryDirectory(prefix="lto-tritonserver-") as tmp:
        command = [sys.executable, "-m", "pip", "download", f"nvidia-pytriton=={VERSION}", "--no-deps",
                   "--only-binary=:all:", "-d", tmp, "--quiet"]  # fmt: skip
        proc = subprocess.run(command, capture_output=True, text=True, check=False)
        wheel = Path(tmp) / wheel_name
        if proc.returncode != 0 or not wheel.is_file():
            last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
            raise BackendUnavailable(f"cannot download nvidia-pytriton=={VERSION}: {last}")
        if _sha256(wheel) != sha256:
            raise BackendUnavailable(f"{wheel_name} does not match its pinned sha256; nothing was unpacked")
        staging = Path(tempfile.mkdtemp(prefix=".unpacking-", dir=_parent(root)))
        try:
            with zipfile.ZipFile(wheel) as archive:
                archive.extractall(staging)
            for executable in [
                Install(staging).binary,
                *Install(staging).stubs.glob("*/triton_python_backend_stub"),
            ]:
                executable.chmod(0o755)
            if root.exists():
                shutil.rmtree(root)
            staging.rename(root)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return found


def stub_numpy(found: Install) -> Path:
    """A folder holding NumPy 1.x for python-backend models (STUB_NUMPY), installed once beside
    the server with pip (hash-checked)."""
    key = (f"{sys.version_info.major}.{sys.version_info.minor}", platform.machine())
    target = found.root / f"numpy-{key[0]}"
    if (target / "numpy" / "__init__.py").is_file():
        return target
    if key not in STUB_NUMPY_WHEELS:
        raise BackendUnavailable(
            f"no pinned {STUB_NUMPY} wheel for Python {key[0]} on {key[1]} "
            "(Triton's python backend needs NumPy 1.x)"
        )
    with tempfile.TemporaryDirectory(prefix="lto-stub-numpy-") as tmp:
        requirements = Path(tmp) / "requirements.txt"
        requirements.write_text(f"{STUB_NUMPY} --hash=sha256:{STUB_NUMPY_WHEELS[key]}\n")
        staging = Path(tmp) / "target"
        command = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--only-binary=:all:",
                   "--require-hashes", "-r", str(requirements), "--target", str(staging)]  # fmt: skip
        proc = subprocess.run(command, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
            raise BackendUnavailable(f"cannot install {STUB_NUMPY} for the python backend: {last}")
        shutil.rmtree(target, ignore_errors=True)
        shutil.move(str(staging), target)
    return target


def _python_stub(found: Install) -> None:
    """The python backend runs models through a stub built for one Python minor version: put this
    interpreter's beside the backend, where Triton looks for it (nvidia-pytriton does the same)."""
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    stub = found.stubs / version / "triton_python_backend_stub"
    if not stub.is_file():
        shipped = ", ".join(sorted(p.name for p in found.stubs.iterdir())) if found.stubs.is_dir() else "none"
        raise BackendUnavailable(
            f"the tritonserver wheel has no python backend stub for Python {version} ({shipped})"
        )
    placed = found.backends / "python" / stub.name
    if not placed.is_file() or _sha256(placed) != _sha256(stub):
        shutil.copyfile(stub, placed)
        placed.chmod(0o755)


def _parent(root: Path) -> Path:
    root.parent.mkdir(parents=True, exist_ok=True)
    return root.parent


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Server:
    process: subprocess.Popen[bytes]
    url: str  # http://127.0.0.1:PORT
    grpc_port: int
    log: Path

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/v2/health/ready", timeout=2) as reply:
                return int(reply.status) == 200
        except (urllib.error.URLError, OSError):
            return False

    def log_text(self) -> str:
        try:
            return self.log.read_text(errors="replace")
        except OSError:
            return ""

    def stop(self, timeout_s: float = _STOP_TIMEOUT_S) -> int:
        """SIGTERM (Triton unloads its models and exits 0), SIGKILL after `timeout_s`."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return int(self.process.returncode)


def start(
    found: Install,
    repository: Path,
    log: Path,
    *,
    python_path: Sequence[str] = (),
    extra_args: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    wait_ready: bool = True,
) -> Server:
    """tritonserver on `repository`, HTTP and gRPC on free local ports, its output in `log`. With
    `wait_ready`, returns once every model is ready, and raises BackendUnavailable with the log's
    last lines when the server exits first or is not ready in time."""
    _python_stub(found)
    http_port, grpc_port, metrics_port = _free_port(), _free_port(), _free_port()
    command = [
        str(found.binary), f"--model-repository={repository}", f"--backend-directory={found.backends}",
        f"--http-port={http_port}", f"--grpc-port={grpc_port}", f"--metrics-port={metrics_port}",
        "--allow-grpc=true", *extra_args,
    ]  # fmt: skip
    run_env = {**os.environ, **(env or {})}
    if python_path:  # the stub's embedded interpreter ignores PYTHONPATH (optimize/export/templates/model.py)
        paths = [str(stub_numpy(found)), *python_path]
        run_env["LTO_PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    with log.open("wb") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=run_env)
    server = Server(process, f"http://127.0.0.1:{http_port}", grpc_port, log)
    if not wait_ready:
        return server
    deadline = time.monotonic() + _START_TIMEOUT_S
    while time.monotonic() < deadline:
        if server.ready():
            return server
        if process.poll() is not None:
            break
        time.sleep(0.25)
    code = server.stop(5.0)
    tail = "; ".join(server.log_text().strip().splitlines()[-5:])
    raise BackendUnavailable(f"tritonserver did not become ready (exit {code}): {tail}")


__all__ = ["VERSION", "Install", "Server", "install", "start", "stub_numpy"]
