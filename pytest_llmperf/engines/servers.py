"""Start and stop a real OpenAI-compatible server on loopback, without pytest.

``with serve_llama_server(model_path, parallel=4) as server:`` starts llama.cpp's own
``llama-server`` (continuous batching over ``parallel`` slots; built from the installed
llama-cpp-python's sources, see build_tools below) on a free port of 127.0.0.1 and waits
until ``/health`` answers; ``with serve(model_path) as server:`` does the same with the lighter
``python -m llama_cpp.server`` (one request at a time), waiting for ``/v1/models``. Both are
stopped on exit (terminate, then kill; on Linux also when the starting process dies). A server
that does not come up within its deadline fails with one line that carries its stderr's tail.

llama.cpp's own tools (``llama-server``, ``llama-bench``), built from the llama.cpp sources
vendored in the installed llama-cpp-python's sdist: the same llama.cpp as the in-process engine,
so a served or llama-bench figure differs from ours by the serving or the timing, not the code.
Where the installed wheel ships its shared libraries (Linux: llama_cpp/lib and libllama-common),
only the tools' own files are compiled and linked to those very libraries (the linked route,
llama_tools.cmake: a minute or two); else all of llama.cpp is built (the full route, 10-25
minutes on 2 cores), with one line saying why.

One folder per llama-cpp-python version under the cache dir (``$LLMPERF_CACHE_DIR`` or the user
cache): ``native/llama-cpp-python-<version>/`` holds the sources, ``build.log``, the full build
(``build``) and the linked builds (``linked-<key>/build``, the key naming the shipped libraries'
location, sizes and times, since the binaries load them from there). The sdist is fetched
with ``pip download`` (pip's HTTP cache and index settings apply), or taken from
``$LLMPERF_LLAMA_CPP_SDIST``. A lock file keeps two processes from building at once; the second
waits, then finds the tools built. Anything missing (cmake, a C++ compiler) or failing is one
line that says what to do, with the build log's path; while a step runs, its percentage (from
the build log) and seconds are told at least every 10 s."""

from __future__ import annotations

import contextlib
import ctypes
import enum
import hashlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, distribution, version
from pathlib import Path
from typing import IO, Any

from ..core.errors import ConfigError, EngineError, ToolBuildError
from ..core.formats import escaped
from ..core.settings import ENGINE_DEFAULTS, SERVER_N_CTX
from ..models.gguf import default_cache_dir
from .http import HttpEngine
from .llama_cpp_native import check_gguf, default_threads

HOST = "127.0.0.1"
START_TIMEOUT_S = 60.0
#: Slots of the ``llmperf_llama_server`` fixture (and ``llmperf load --serve``'s floor).
LLAMA_SERVER_PARALLEL = 4
STOP_TIMEOUT_S = 5.0


def free_port(host: str = HOST) -> int:
    """A port the OS says is free now (a race is possible but rare on loopback)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True)
class Server:
    """A running server: its base URL (``http://127.0.0.1:PORT/v1``) and the model it serves."""

    url: str
    model_path: str
    model: str  # the name the server answers to (``--model_alias``)
    threads: int
    pid: int
    kind: str = "llama-cpp-python"  # or "llama-server" (llama.cpp's own, continuous batching)
    parallel: int = 1  # request slots (llama-server --parallel); 1: one request at a time

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:PORT``: where ``/health`` and ``/metrics`` are."""
        return self.url.rsplit("/v1", 1)[0]

    def engine(self, **kwargs: Any) -> HttpEngine:
        """An HttpEngine on this server (keyword arguments go to HttpEngine)."""
        kwargs.setdefault("model", self.model)
        return HttpEngine(self.url, **kwargs)


def server_command(
    model_path: str | os.PathLike[str],
    port: int,
    *,
    threads: int,
    n_ctx: int = SERVER_N_CTX,
    n_batch: int = ENGINE_DEFAULTS["n_batch"],
    alias: str | None = None,
) -> list[str]:
    # interrupt_requests off: by default a new request cuts the running stream short, which
    # would turn every concurrent request but the last into an early-ended run.
    flags = {
        "--model": model_path,
        "--model_alias": alias or Path(model_path).stem,
        "--host": HOST,
        "--port": port,
        "--n_threads": threads,
        "--n_threads_batch": threads,
        "--n_ctx": n_ctx,
        "--n_batch": n_batch,
        "--interrupt_requests": False,
        "--verbose": False,
    }
    return [sys.executable, "-m", "llama_cpp.server", *_flags(flags)]


def _flags(values: Mapping[str, object]) -> list[str]:
    """A command's flags with their values: ``{"--port": 8080}`` is ``["--port", "8080"]``."""
    return [word for flag, value in values.items() for word in (flag, str(value))]


def _ready(url: str, timeout_s: float) -> bool:
    import httpx

    try:
        return httpx.get(url, timeout=timeout_s).status_code == 200
    except httpx.HTTPError:
        return False


def _tail(path: Path, n_chars: int = 300) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return escaped(" | ".join(lines[-3:])[-n_chars:])


def _die_with_parent() -> Callable[[], None] | None:
    """Linux: a ``preexec_fn`` by which the server gets SIGTERM when the process that started it
    dies (even by SIGKILL), so a killed pytest leaves no server behind. prctl is looked up here,
    before the fork: between fork and exec the child only calls it (no import, no dlopen)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None

    def in_child() -> None:  # pragma: no cover - runs in the child
        prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG

    return in_child


@contextlib.contextmanager
def _launch(
    command: list[str], ready_url: str, name: str, start_timeout_s: float, env: dict[str, str] | None = None
) -> Iterator[subprocess.Popen[bytes]]:
    """Run ``command`` until the ``with`` block ends; ready when ``ready_url`` answers 200.

    Stopped on every exit (an exception, a failed test, Ctrl-C): SIGTERM, then SIGKILL."""
    with tempfile.TemporaryDirectory(prefix="llmperf-server-") as tmp:
        log = Path(tmp) / "stderr.log"
        with log.open("wb") as err:
            proc = subprocess.Popen(
                command,
                stdout=subprocess.DEVNULL,
                stderr=err,
                stdin=subprocess.DEVNULL,
                env=env,
                # preexec_fn is unsafe with threads when it takes locks; this one makes one system call.
                preexec_fn=_die_with_parent(),  # noqa: PLW1509
            )
        try:
            deadline = time.monotonic() + start_timeout_s
            while not _ready(ready_url, 1.0):
                if proc.poll() is not None:
                    tail = _tail(log) or "no output"
                    hint = '; install it: pip install "llama-cpp-python[server]"' if "No module named" in tail else ""
                    raise EngineError(f"{name} exited with status {proc.returncode} before it was ready: {tail}{hint}")
                if time.monotonic() > deadline:
                    raise EngineError(
                        f"{name} did not answer {ready_url} within {start_timeout_s:.0f} s: {_tail(log) or 'no output'}"
                    )
                time.sleep(0.1)
            yield proc
        finally:
            stop(proc)


@contextlib.contextmanager
def serve(
    model_path: str | os.PathLike[str],
    *,
    threads: int | None = None,
    n_ctx: int = SERVER_N_CTX,
    n_batch: int = ENGINE_DEFAULTS["n_batch"],
    alias: str | None = None,
    start_timeout_s: float = START_TIMEOUT_S,
) -> Iterator[Server]:
    """Run llama-cpp-python's server on a free loopback port for the ``with`` block."""
    path = check_gguf(model_path)
    threads = threads or default_threads()
    port = free_port()
    url = f"http://{HOST}:{port}/v1"
    command = server_command(path, port, threads=threads, n_ctx=n_ctx, n_batch=n_batch, alias=alias)
    with _launch(command, f"{url}/models", "llama_cpp.server", start_timeout_s) as proc:
        yield Server(url=url, model_path=str(path), model=alias or path.stem, threads=threads, pid=proc.pid)


def llama_server_command(
    binary: str | os.PathLike[str],
    model_path: str | os.PathLike[str],
    port: int,
    *,
    threads: int,
    parallel: int,
    n_ctx: int = SERVER_N_CTX,
    n_batch: int = ENGINE_DEFAULTS["n_batch"],
    alias: str | None = None,
) -> list[str]:
    """llama.cpp's server with ``parallel`` slots of ``n_ctx`` tokens each (continuous
    batching is its default) and the Prometheus ``/metrics`` endpoint."""
    flags = {
        "--model": model_path,
        "--alias": alias or Path(model_path).stem,
        "--host": HOST,
        "--port": port,
        "--threads": threads,
        "--threads-batch": threads,
        "--ctx-size": n_ctx * parallel,
        "--batch-size": n_batch,
        "--parallel": parallel,
    }
    return [str(binary), *_flags(flags), "--metrics", "--no-webui"]


@contextlib.contextmanager
def serve_llama_server(
    model_path: str | os.PathLike[str],
    *,
    parallel: int = 4,
    threads: int | None = None,
    n_ctx: int = SERVER_N_CTX,
    n_batch: int = ENGINE_DEFAULTS["n_batch"],
    alias: str | None = None,
    start_timeout_s: float = START_TIMEOUT_S,
    build: bool = True,
) -> Iterator[Server]:
    """Run llama.cpp's ``llama-server`` (of the installed llama-cpp-python's version, built
    once: ``llmperf server build``) on a free loopback port for the ``with`` block."""
    if parallel < 1:
        raise ConfigError(f"llama-server needs parallel >= 1 slots, got {parallel}")
    binary = tool_path("llama-server", build=build)
    path = check_gguf(model_path)
    threads = threads or default_threads()
    port = free_port()
    url = f"http://{HOST}:{port}/v1"
    command = llama_server_command(
        binary, path, port, threads=threads, parallel=parallel, n_ctx=n_ctx, n_batch=n_batch, alias=alias
    )
    with _launch(command, f"http://{HOST}:{port}/health", "llama-server", start_timeout_s) as proc:
        yield Server(
            url=url,
            model_path=str(path),
            model=alias or path.stem,
            threads=threads,
            pid=proc.pid,
            kind="llama-server",
            parallel=parallel,
        )


def stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM, then SIGKILL after ``STOP_TIMEOUT_S``."""
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(STOP_TIMEOUT_S)


TOOLS = ("llama-server", "llama-bench")
#: Environment variable naming a local llama-cpp-python sdist (offline machines).
SDIST_ENV = "LLMPERF_LLAMA_CPP_SDIST"
#: The full build's flags (BuildRoute.FULL: all of llama.cpp from the sdist).
CMAKE_FLAGS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DLLAMA_CURL=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_BUILD_TOOLS=ON",
    "-DLLAMA_BUILD_SERVER=ON",
    # The server runs with --no-webui: no UI assets fetched from the network during the build.
    "-DLLAMA_USE_PREBUILT_UI=OFF",
    # $ORIGIN-relative library paths: the built folder works wherever the cache is moved.
    "-DCMAKE_BUILD_RPATH_USE_ORIGIN=ON",
    "-DBUILD_SHARED_LIBS=ON",
)
DOWNLOAD_TIMEOUT_S = 900.0
CONFIGURE_TIMEOUT_S = 600.0
BUILD_TIMEOUT_S = 3600.0
#: How long a process waits for another one's build before giving up.
LOCK_TIMEOUT_S = BUILD_TIMEOUT_S + DOWNLOAD_TIMEOUT_S
STAMP = "complete"
#: In a linked build's folder: why linking failed (the next builds go the full way at once).
LINK_FAILED = "link-failed"
#: The shared libraries of llama_cpp/lib the linked tools load (and libllama-common beside them).
LINKED_LIBRARIES = ("libggml-base.so", "libggml.so", "libllama.so", "libmtmd.so")
#: The linked build's CMake project (written as CMakeLists.txt into its folder).
LINKED_PROJECT = Path(__file__).with_name("llama_tools.cmake")
#: The llama.cpp sources the linked build compiles (besides headers).
LINKED_SOURCES = ("tools/server/CMakeLists.txt", "tools/llama-bench/CMakeLists.txt", "tools/ui/CMakeLists.txt")


class BuildRoute(enum.Enum):
    """How the tools are built."""

    LINKED = "linked"  # only the tools' own files, linked to the libraries llama-cpp-python ships
    FULL = "full"  # all of llama.cpp from the sdist (ggml, libllama, mtmd, common and the tools)


@dataclass(frozen=True)
class ShippedLibraries:
    """The shared libraries of the installed llama-cpp-python the tools can link to."""

    lib_dir: Path  # llama_cpp/lib: libllama, ggml, mtmd, as the in-process engine loads them
    common: Path  # libllama-common (llama.cpp's common library: arguments, chat, sampling)
    header: Path | None  # the llama.h the wheel ships, if it does
    key: str  # 12 hex digits of their location, sizes and times: another install builds anew


@dataclass(frozen=True)
class BuildPlan:
    """Where one llama-cpp-python version's tools are (or will be) and how they are built."""

    route: BuildRoute
    folder: Path  # holds build/ (build/bin: the binaries)
    shipped: ShippedLibraries | None  # the route is LINKED when this is given
    why_full: str = ""  # on the full route: why the tools cannot link the shipped libraries


@dataclass(frozen=True)
class NativeTools:
    """The built tools of one llama-cpp-python version."""

    version: str
    build_dir: Path
    paths: dict[str, Path]
    build_s: float | None  # seconds this call spent building; None when they were cached
    log: Path
    route: BuildRoute = BuildRoute.FULL
    linked_to: Path | None = None  # the folder of the shipped libraries on the linked route


def installed_version() -> str:
    """The installed llama-cpp-python's version (without importing it: no library load)."""
    try:
        return version("llama-cpp-python")
    except PackageNotFoundError:
        raise ToolBuildError("llama-cpp-python is not installed; pip install llama-cpp-python") from None


def tools_root(version: str | None = None) -> Path:
    return default_cache_dir() / "native" / f"llama-cpp-python-{version or installed_version()}"


def shipped_libraries() -> ShippedLibraries | str:
    """The installed llama-cpp-python's shared libraries (from its file list, nothing loaded),
    or why the tools cannot be linked to them."""
    if not sys.platform.startswith("linux"):
        return f"linking to llama-cpp-python's libraries is done on Linux only (this is {sys.platform})"
    try:
        dist = distribution("llama-cpp-python")
        files = [Path(str(dist.locate_file(f))) for f in dist.files or ()]
    except PackageNotFoundError:
        return "llama-cpp-python is not installed"
    if not files:
        return "the installed llama-cpp-python lists no files (its metadata has no RECORD)"
    lib_dirs = [p.parent for p in files if p.name == "libllama.so" and p.parent.parts[-2:] == ("llama_cpp", "lib")]
    if not lib_dirs:
        return "the installed llama-cpp-python ships no llama_cpp/lib/libllama.so"
    lib_dir = lib_dirs[0]
    missing = [name for name in LINKED_LIBRARIES if not (lib_dir / name).is_file()]
    if missing:
        return f"the installed llama-cpp-python ships no {', '.join(missing)} in {lib_dir}"
    commons = sorted(
        (p for p in files if p.name == "libllama-common.so" and p.is_file()), key=lambda p: p.parent != lib_dir
    )
    if not commons:
        return "the installed llama-cpp-python ships no libllama-common.so (llama.cpp's common library)"
    headers = [p for p in files if p.name == "llama.h" and p.is_file()]
    linked = sorted({*lib_dir.glob("lib*.so*"), commons[0]})
    stamp = [str(lib_dir.resolve()), str(commons[0].resolve())]
    stamp += [f"{p.name} {p.stat().st_size} {p.stat().st_mtime_ns}" for p in linked]
    key = hashlib.sha256("\n".join(stamp).encode()).hexdigest()[:12]
    return ShippedLibraries(lib_dir, commons[0], headers[0] if headers else None, key)


def build_plan(root: Path) -> BuildPlan:
    """The linked route where the installed wheel ships its libraries (and linking them did not
    fail before), else the full build."""
    shipped = shipped_libraries()
    if isinstance(shipped, str):
        return BuildPlan(BuildRoute.FULL, root, None, shipped)
    folder = root / f"linked-{shipped.key}"
    with contextlib.suppress(OSError):
        failed = (folder / LINK_FAILED).read_text().strip()
        return BuildPlan(BuildRoute.FULL, root, None, f"{failed} (before; delete {folder} to try again)")
    return BuildPlan(BuildRoute.LINKED, folder, shipped)


def _binary(folder: Path, name: str) -> Path:
    return folder / "build" / "bin" / (name + (".exe" if sys.platform == "win32" else ""))


def _built(folder: Path) -> bool:
    return (folder / "build" / STAMP).is_file() and all(os.access(_binary(folder, t), os.X_OK) for t in TOOLS)


def tool_path(name: str, *, build: bool = True, progress: Callable[[str], None] | None = None) -> Path:
    """Path of llama.cpp's ``name`` (``llama-server`` or ``llama-bench``) for the installed
    llama-cpp-python, building both tools first when they are not cached (``build=True``;
    ``progress`` hears what the build does, with its percentage, at least every 10 s)."""
    if name not in TOOLS:
        raise ToolBuildError(f"unknown llama.cpp tool {name!r}; one of: {', '.join(TOOLS)}")
    root = tools_root()
    plan = build_plan(root)
    if _built(plan.folder):
        return _binary(plan.folder, name)
    if not build:
        raise ToolBuildError(
            f"{name} is not built for llama-cpp-python {root.name.rsplit('-', 1)[-1]}; "
            "run `llmperf server build` (a few minutes, once per version)"
        )
    built = build_tools(progress)
    if progress is not None and built.build_s is not None:
        progress(f"llmperf: built {', '.join(TOOLS)} in {built.build_s:.0f} s (cached for later runs)")
    return built.paths[name]


def _tools(version: str, plan: BuildPlan, build_s: float | None, log: Path) -> NativeTools:
    return NativeTools(
        version,
        plan.folder / "build",
        {t: _binary(plan.folder, t) for t in TOOLS},
        build_s,
        log,
        plan.route,
        plan.shipped.lib_dir if plan.shipped is not None else None,
    )


def build_tools(
    progress: Callable[[str], None] | None = None, *, status: Callable[[str], None] | None = None
) -> NativeTools:
    """Build llama-server and llama-bench for the installed llama-cpp-python (no-op if cached).

    ``progress`` hears each step as a line, and while a step runs its percentage (from the build
    log) and seconds: a line when it moved and ``LINE_S`` passed, at least every ``SILENCE_S``.
    ``status`` (a terminal's line, rewritten in place) hears the running state instead, every
    ``STATUS_S``."""
    tell = _Teller(progress or (lambda line: None), status)
    version = installed_version()
    root = tools_root(version)
    log = root / "build.log"
    plan = build_plan(root)
    if _built(plan.folder):
        return _tools(version, plan, None, log)
    root.mkdir(parents=True, exist_ok=True)
    with _lock(root / ".lock", tell.line):
        plan = build_plan(root)  # another process may have built them (or failed to link) meanwhile
        if _built(plan.folder):
            return _tools(version, plan, None, log)
        cmake, jobs = _check_toolchain()
        begin = time.monotonic()
        with log.open("w") as out:
            source = _sources(root, version, out, tell)
            if plan.shipped is not None:
                plan = _build_linked(plan, root, source, cmake, jobs, out, tell)
            if plan.route is BuildRoute.FULL:
                _build_full(root, source, version, cmake, jobs, out, plan.why_full, tell)
        tools = _tools(version, plan, time.monotonic() - begin, log)
        missing = [t for t, p in tools.paths.items() if not p.is_file()]
        if missing:
            raise ToolBuildError(f"the build finished but {', '.join(missing)} is missing; see {log}")
        (tools.build_dir / STAMP).write_text(
            f"llama-cpp-python {version}, {plan.route.value} build in {tools.build_s:.0f} s\n"
        )
        return tools


def _build_linked(
    plan: BuildPlan, root: Path, source: Path, cmake: str, jobs: int, out: IO[str], tell: _Teller
) -> BuildPlan:
    """Compile the tools' own files against the shipped libraries; on failure, the full plan
    (why written into the folder, so the next build goes the full way at once)."""
    assert plan.shipped is not None
    shipped = plan.shipped
    log = Path(out.name)
    why = _unlinkable(source, shipped)
    if why:
        return _link_failed(plan, root, why)
    common = shipped.common.read_bytes()
    flags = {
        "CMAKE_BUILD_TYPE": "Release",
        "LLAMA_SRC": str(source),
        "SHIPPED_LIB_DIR": str(shipped.lib_dir),
        "COMMON_LIB": str(shipped.common),
        # how the shipped libllama-common was configured, read from its imports: the tools'
        # headers must agree (HTTPS in cpp-httplib, llama.cpp's subprocess helper)
        "LLAMA_OPENSSL": "ON" if b"libssl.so" in common else "OFF",
        "LLAMA_SUBPROCESS": "ON" if b"posix_spawn" in common else "OFF",
    }
    project = plan.folder / "project"
    project.mkdir(parents=True, exist_ok=True)
    (project / "CMakeLists.txt").write_text(LINKED_PROJECT.read_text())
    build = plan.folder / "build"
    tell.line(f"llmperf: configuring {' and '.join(TOOLS)} against the libraries in {shipped.lib_dir} (log: {log})")
    configure = [cmake, "-S", str(project), "-B", str(build), *(f"-D{k}={v}" for k, v in flags.items())]
    rc = _step(configure, out, log, "configuring", CONFIGURE_TIMEOUT_S, tell, check=False)
    if rc == 0:
        tell.line(f"llmperf: compiling {' and '.join(TOOLS)} with {jobs} jobs (their own files only)")
        rc = _step(
            [cmake, "--build", str(build), "--config", "Release", "-j", str(jobs)],
            out,
            log,
            "building",
            BUILD_TIMEOUT_S,
            tell,
            check=False,
        )
    if rc == 0:
        return plan
    return _link_failed(plan, root, f"linking to llama-cpp-python's libraries failed (exit status {rc}; see {log})")


def _link_failed(plan: BuildPlan, root: Path, why: str) -> BuildPlan:
    """The full plan, ``why`` written into the linked folder: the next builds go the full way at once."""
    plan.folder.mkdir(parents=True, exist_ok=True)
    (plan.folder / LINK_FAILED).write_text(why + "\n")
    return BuildPlan(BuildRoute.FULL, root, None, why)


def _unlinkable(source: Path, shipped: ShippedLibraries) -> str:
    """Why these sources cannot be linked to these libraries ('' when they can)."""
    missing = [name for name in LINKED_SOURCES if not (source / name).is_file()]
    if missing:
        return f"the sdist's llama.cpp has no {', '.join(missing)}"
    if not LINKED_PROJECT.is_file():
        return f"{LINKED_PROJECT} is missing from this install of pytest-llmperf"
    if shipped.header is not None:
        with contextlib.suppress(OSError):
            if shipped.header.read_bytes() != (source / "include" / "llama.h").read_bytes():
                return f"the sdist's include/llama.h differs from the installed {shipped.header}"
    return ""


def _build_full(
    root: Path, source: Path, version: str, cmake: str, jobs: int, out: IO[str], why: str, tell: _Teller
) -> None:
    """All of llama.cpp: ggml, libllama, mtmd, common and the tools (10-25 minutes on 2 cores)."""
    log = Path(out.name)
    tell.line(f"llmperf: building all of llama.cpp {version} (10-25 minutes on 2 cores): {why}")
    tell.line(f"llmperf: configuring llama.cpp {version} (log: {log})")
    _step(
        [cmake, "-S", str(source), "-B", str(root / "build"), *CMAKE_FLAGS],
        out,
        log,
        "configuring",
        CONFIGURE_TIMEOUT_S,
        tell,
    )
    tell.line(f"llmperf: building {' and '.join(TOOLS)} with {jobs} jobs (several minutes)")
    build = [cmake, "--build", str(root / "build"), "--config", "Release", "--target", *TOOLS, "-j", str(jobs)]
    _step(build, out, log, "building", BUILD_TIMEOUT_S, tell)


def _check_toolchain() -> tuple[str, int]:
    cmake = shutil.which("cmake")
    if cmake is None:
        raise ToolBuildError(
            "cmake not found: building llama-server needs cmake and a C++ compiler "
            "(apt-get install cmake g++, or pip install cmake)"
        )
    compilers = [os.environ.get("CXX", ""), "c++", "g++", "clang++", "cl"]
    if not any(c and shutil.which(c.split()[0]) for c in compilers):
        raise ToolBuildError(
            "no C++ compiler found (c++, g++, clang++ or $CXX): building llama-server needs one "
            "(apt-get install g++ / xcode-select --install)"
        )
    return cmake, max(1, os.cpu_count() or 1)


def _sources(root: Path, version: str, out: IO[str], tell: _Teller) -> Path:
    """``vendor/llama.cpp`` of the sdist, extracted once under ``root/src``."""
    source_root = root / "src"
    found = sorted(source_root.glob("*/vendor/llama.cpp/CMakeLists.txt"))
    if found:
        return found[0].parent
    sdist_env = os.environ.get(SDIST_ENV)
    with tempfile.TemporaryDirectory(prefix=".download-", dir=root) as tmp:
        if sdist_env:
            sdist = Path(sdist_env)
            if not sdist.is_file():
                raise ToolBuildError(f"${SDIST_ENV} is {sdist_env!r}, which is not a file; unset it or fix the path")
        else:
            tell.line(f"llmperf: fetching the llama-cpp-python {version} sdist with pip download")
            command = [
                sys.executable,
                "-m",
                "pip",
                "download",
                f"llama-cpp-python=={version}",
                "--no-deps",
                "--no-binary",
                ":all:",
                "-d",
                tmp,
            ]
            _step(command, out, Path(out.name), "downloading the sdist of", DOWNLOAD_TIMEOUT_S, tell)
            sdists = sorted(Path(tmp).glob("llama_cpp_python-*.tar.gz"))
            if not sdists:
                raise ToolBuildError(f"pip download gave no llama-cpp-python sdist; see {out.name}")
            sdist = sdists[0]
        staging = Path(tmp) / "src"
        _extract_vendor(sdist, staging)
        if source_root.exists():
            shutil.rmtree(source_root)
        staging.rename(source_root)
    found = sorted(source_root.glob("*/vendor/llama.cpp/CMakeLists.txt"))
    if not found:
        raise ToolBuildError(f"the sdist has no vendor/llama.cpp: not a llama-cpp-python sdist? (see {out.name})")
    return found[0].parent


def _extract_vendor(sdist: Path, target: Path) -> None:
    """Only ``*/vendor/llama.cpp/...`` members, with tarfile's safe ``data`` filter if present."""
    try:
        with tarfile.open(sdist) as tar:
            members = [m for m in tar.getmembers() if "/vendor/llama.cpp/" in m.name + "/"]
            if hasattr(tarfile, "data_filter"):  # Python 3.12, and 3.10.12+ / 3.11.4+
                tar.extractall(target, members=members, filter="data")
            else:
                tar.extractall(target, members=members)  # an older Python: no filters
    except (tarfile.TarError, OSError) as exc:
        raise ToolBuildError(f"cannot unpack {sdist}: {exc}") from None


#: While a step runs: the build log is read this often.
POLL_S = 0.5
#: Lines (no terminal): a new percentage at most this often...
LINE_S = 5.0
#: ...and a line at least this often, whatever the build shows (no silence of 10 s).
SILENCE_S = 9.0
#: A terminal's status line is rewritten this often.
STATUS_S = 2.0
#: A build tool's progress in its log: make's ``[ 45%]``, ninja's ``[12/25]`` at a line's start.
_PERCENT = re.compile(rb"^\[\s*(\d{1,3})%\]", re.MULTILINE)
_COUNT = re.compile(rb"^\[(\d+)/(\d+)\]", re.MULTILINE)


class _Teller:
    """What a build says: its steps as lines (``line``); while a step runs, its state
    (``running``): on ``status`` every ``STATUS_S`` when there is a terminal line to rewrite, else
    as a line when its percentage moved and ``LINE_S`` passed, and at least every ``SILENCE_S``."""

    def __init__(self, say: Callable[[str], None], status: Callable[[str], None] | None) -> None:
        self.say = say
        self.status = status
        self.last_line = time.monotonic()
        self.last_status = 0.0
        self.told: int | None = None

    def line(self, text: str) -> None:
        self.say(text)
        self.last_line = time.monotonic()

    def running(self, what: str, elapsed_s: float, percent: int | None, log: Path) -> None:
        now = time.monotonic()
        if percent is None:
            text = f"llmperf: still {what} llama.cpp ({elapsed_s:.0f} s so far; log: {log})"
        else:
            text = f"llmperf: {what} llama.cpp: {percent}% ({elapsed_s:.0f} s so far)"
        if self.status is not None:
            if now - self.last_status >= STATUS_S:
                self.status(text)
                self.last_status = now
            return
        since = now - self.last_line
        if (percent != self.told and since >= LINE_S) or since >= SILENCE_S:
            self.line(text)
            self.told = percent


class _LogProgress:
    """The last progress mark a build wrote into its log after ``offset``."""

    def __init__(self, log: Path, offset: int) -> None:
        self.log = log
        self.offset = offset
        self.partial = b""
        self.percent: int | None = None

    def read(self) -> int | None:
        try:
            with self.log.open("rb") as handle:
                handle.seek(self.offset)
                data = handle.read()
        except OSError:
            return self.percent
        self.offset += len(data)
        text = self.partial + data
        complete, _, self.partial = text.rpartition(b"\n")
        for match in _PERCENT.finditer(complete):
            self.percent = min(100, int(match.group(1)))
        for match in _COUNT.finditer(complete):
            done, total = int(match.group(1)), int(match.group(2))
            if total:
                self.percent = min(100, 100 * done // total)
        return self.percent


def _step(
    command: list[str],
    out: IO[str],
    log: Path,
    what: str,
    timeout_s: float,
    tell: _Teller | None = None,
    *,
    check: bool = True,
) -> int:
    """Run one build step into the log, in its own process group: killed with all its
    children on timeout, Ctrl-C or SIGTERM (a stopped build leaves no compiler running).
    ``tell`` hears how it goes while it runs (the percentage its log shows): a long build never
    looks hung. A non-zero exit status is an error, or returned with ``check=False``."""
    out.write(f"\n$ {' '.join(command)}\n")
    out.flush()
    watch = _LogProgress(log, out.tell())
    proc = subprocess.Popen(
        command, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
    )
    began = time.monotonic()
    try:
        with _sigterm_raises():
            while True:
                try:
                    rc = proc.wait(POLL_S)
                    break
                except subprocess.TimeoutExpired:
                    elapsed = time.monotonic() - began
                    if elapsed > timeout_s:
                        raise
                    if tell is not None:
                        tell.running(what, elapsed, watch.read(), log)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        raise ToolBuildError(
            f"{what} llama.cpp took longer than {timeout_s:.0f} s and was stopped; see {log}"
        ) from None
    except BaseException:
        _kill_group(proc)
        raise
    if rc != 0 and check:
        raise ToolBuildError(f"{what} llama.cpp failed (exit status {rc}); see {log}")
    return rc


@contextlib.contextmanager
def _sigterm_raises() -> Iterator[None]:
    """SIGTERM (``timeout``, a CI runner cancelling) as SystemExit while we wait, so the
    build's process group is killed on the way out (main thread only: signals go there)."""
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "SIGTERM"):
        yield
        return

    def stop(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _kill_group(proc: subprocess.Popen) -> None:
    with contextlib.suppress(OSError):
        os.killpg(proc.pid, signal.SIGKILL) if hasattr(os, "killpg") else proc.kill()
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(10)


@contextlib.contextmanager
def _lock(path: Path, say: Callable[[str], None]) -> Iterator[None]:
    """An exclusive lock file (``flock``: released by the OS if the holder dies)."""
    try:
        import fcntl
    except ImportError:  # Windows: no lock; concurrent builds there are the user's choice
        yield
        return
    with path.open("a") as handle:
        deadline = time.monotonic() + LOCK_TIMEOUT_S
        told = False
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if not told:
                    say(f"llmperf: another process is building llama.cpp's tools; waiting (lock {path})")
                    told = True
                if time.monotonic() > deadline:
                    raise ToolBuildError(
                        f"waited {LOCK_TIMEOUT_S:.0f} s for another process's llama.cpp build; remove {path} "
                        "if no build is running"
                    ) from None
                time.sleep(1.0)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
