"""The engine worker: llama.cpp in a child process, so a native crash costs one test.

Real llama.cpp throughout. The AMX case is the real crash where the CPU has AMX (this project's
machine: SIGILL or SIGSEGV in llama.cpp's AMX kernel); SIGSEGV, SIGABRT and a hang are injected in the
worker (``LLMPERF_WORKER_FAULT``) because no real model produces them on demand; a GGUF with
too many layers is llama.cpp's real abort.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Mapping
from pathlib import Path

import pytest

from pytest_llmperf import LlamaCppEngine, ModelSpec, Workload, ensure_model, measure
from pytest_llmperf.core.workload import LATER_FIELDS, NativeCounters, RunTrace
from pytest_llmperf.engines.llama_cpp_native import AMX_ISSUE, EngineConfig, cpu_has_amx
from pytest_llmperf.measuring.worker import FAULT_ENV, Channel, EngineCrash, WorkerEngine

AMX = cpu_has_amx()
WORKLOAD = Workload(prompt_tokens=8, max_tokens=4, runs=2, warmup=0)
Q8 = ModelSpec(name="q8", n_layer=2, n_embd=128, n_ff=256, n_head=4, n_head_kv=2, dtype="Q8_0")


def config(path: Path, **settings) -> EngineConfig:
    return EngineConfig(model=str(path), threads=1, **settings)


@pytest.fixture(scope="module")
def q8_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return ensure_model(Q8, tmp_path_factory.mktemp("q8"))


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_worker_measures_what_in_process_measures(tiny_model_path: Path) -> None:
    worker = WorkerEngine(config(tiny_model_path))
    local = LlamaCppEngine(tiny_model_path, threads=1)
    pid = worker.pid
    try:
        w, i = worker.info(), local.info()
        for field in ("model_path", "n_params", "n_layer", "quantization", "threads", "n_ctx", "repack"):
            assert getattr(w, field) == getattr(i, field), field
        assert worker.pid != os.getpid() and alive(worker.pid)
        mw, mi = measure(worker, WORKLOAD), measure(local, WORKLOAD)
        assert mw.n_runs == 2 and mw.output_tokens == 4
        assert (mi.n_runs, mi.output_tokens) == (mw.n_runs, mw.output_tokens)
        # The same fed tokens, and llama.cpp's own counters arrive through the boundary.
        tw, ti = worker.run(WORKLOAD, 0), local.run(WORKLOAD, 0)
        assert tw.token_ids == ti.token_ids and len(tw.token_ns) == 4
        assert tw.native is not None and tw.native.decode_tokens == 3 == ti.native.decode_tokens
        assert tw.native.prefill_tokens == ti.native.prefill_tokens == 8
    finally:
        worker.close()
        local.close()
    assert not alive(pid)


def test_layers_are_timed_in_the_worker(tiny_model_path: Path) -> None:
    worker = WorkerEngine(config(tiny_model_path))
    try:
        m = measure(worker, Workload(prompt_tokens=8, max_tokens=4, runs=2, warmup=1), layers=True)
    finally:
        worker.close()
    assert m.layers is not None and len(m.layers.decode.names) == 4 + 1  # 4 layers, then the output


@pytest.mark.parametrize(
    ("fault", "says"),
    [
        ("run:SIGSEGV", "died with SIGSEGV (Segmentation fault) while running model"),
        ("run:SIGABRT", "died with SIGABRT (Aborted) while running model"),
        ("run:SIGILL", "died with SIGILL (illegal instruction) while running model"),
        ("load:SIGSEGV", "died with SIGSEGV (Segmentation fault) while loading model"),
    ],
)
def test_a_crash_is_one_line_and_the_worker_is_gone(
    tiny_model_path: Path, monkeypatch: pytest.MonkeyPatch, fault: str, says: str
) -> None:
    monkeypatch.setenv(FAULT_ENV, fault)
    if fault.startswith("load"):
        with pytest.raises(EngineCrash) as info:
            WorkerEngine(config(tiny_model_path))
    else:
        worker = WorkerEngine(config(tiny_model_path))
        with pytest.raises(EngineCrash) as info:
            worker.run(WORKLOAD, 0)
        assert not worker.alive
        with pytest.raises(EngineCrash, match="is gone"):  # no second try on a dead worker
            worker.run(WORKLOAD, 1)
        worker.close()
    line = str(info.value)
    assert says in line and "\n" not in line
    assert "tiny" in line and "threads=1" in line  # the model and the settings
    # The worker's log (llama.cpp is verbose there), once llama.cpp has said anything.
    assert ("llama.cpp logged nothing; " if fault.startswith("load") else "llama.cpp's last log lines: ") in line


def test_a_hung_worker_is_killed_at_the_deadline(tiny_model_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(FAULT_ENV, "run:hang")
    worker = WorkerEngine(config(tiny_model_path), timeout_s=2)
    started = time.monotonic()
    with pytest.raises(EngineCrash, match=r"did not answer within 2 s while running model .*it was killed"):
        worker.run(WORKLOAD, 0)
    assert time.monotonic() - started < 15
    assert not worker.alive
    worker.close()


def test_too_many_layers_is_llama_cpps_abort_with_its_assert(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import gguf

    real = gguf.GGUFWriter.add_block_count
    monkeypatch.setattr(gguf.GGUFWriter, "add_block_count", lambda self, n: real(self, 600))
    from pytest_llmperf import write_gguf

    path = write_gguf(
        ModelSpec(name="deep", n_layer=2, n_embd=64, n_ff=128, n_head=2, n_head_kv=2), tmp_path / "d.gguf"
    )
    monkeypatch.undo()
    with pytest.raises(EngineCrash) as info:
        WorkerEngine(config(path))
    line = str(info.value)
    assert "died with SIGABRT (Aborted) while loading model d.gguf" in line
    assert "GGML_ASSERT(hparams.n_layer_all > 0 && hparams.n_layer_all <= LLAMA_MAX_LAYERS) failed" in line  # its words
    assert "known cause: the GGUF declares more layers than llama.cpp supports (512)" in line


def test_q8_0_is_measured_with_the_workaround_named(q8_path: Path) -> None:
    """repack unset (auto): on an AMX CPU it is off for quantized weights, and the record
    says why; elsewhere it is llama.cpp's default (on)."""
    engine = LlamaCppEngine(q8_path, threads=2)  # in process: the auto setting keeps this process alive
    try:
        info = engine.info()
        m = measure(engine, WORKLOAD)
    finally:
        engine.close()
    assert m.output_tokens == 4 and info.quantization == "Q8_0"
    if AMX:
        assert info.repack is False
        assert info.repack_note is not None and AMX_ISSUE in info.repack_note
    else:
        assert info.repack is True and info.repack_note is None


def test_q8_0_with_repack_on_is_the_known_amx_cause_or_runs(q8_path: Path) -> None:
    try:
        worker = WorkerEngine(EngineConfig(model=str(q8_path), threads=2, repack=True))
        worker.run(WORKLOAD, 0)
    except EngineCrash as exc:
        assert AMX, f"a crash on a CPU without AMX: {exc}"
        line = str(exc)
        assert re.search(r"died with (SIGILL \(illegal instruction\)|SIGSEGV \(Segmentation fault\))", line), line
        assert "Q8_0" in line
        assert (
            f"known cause: llama.cpp's AMX kernel for quantized weights on this Intel CPU with AMX ({AMX_ISSUE}); "
            "set repack=False" in line
        )
    else:
        worker.close()
        # Without AMX the same setting runs: nothing to work around.
        assert not AMX or os.environ.get("LLMPERF_AMX_FIXED"), "repack=True ran on an AMX CPU: has llama.cpp fixed it?"


def test_the_worker_ends_with_its_controller(tiny_model_path: Path, tmp_path: Path) -> None:
    """SIGKILL of the controller (no cleanup code runs) still ends the worker."""
    pid_file = tmp_path / "pid"
    script = textwrap.dedent(f"""
        import time
        from pytest_llmperf.engines.llama_cpp_native import EngineConfig
        from pytest_llmperf.measuring.worker import WorkerEngine
        w = WorkerEngine(EngineConfig(model={str(tiny_model_path)!r}, threads=1))
        open({str(pid_file)!r}, "w").write(str(w.pid))
        time.sleep(60)
    """)
    controller = subprocess.Popen([sys.executable, "-c", script])
    deadline = time.monotonic() + 60
    while not pid_file.exists() or not pid_file.read_text():
        assert time.monotonic() < deadline and controller.poll() is None
        time.sleep(0.1)
    worker_pid = int(pid_file.read_text())
    assert alive(worker_pid)
    controller.send_signal(signal.SIGKILL)
    controller.wait()
    deadline = time.monotonic() + 10
    while alive(worker_pid) and time.monotonic() < deadline:
        time.sleep(0.1)
        try:
            os.waitpid(worker_pid, os.WNOHANG)  # not our child: ECHILD; the zombie is init's
        except ChildProcessError:
            pass
    assert not alive(worker_pid) or Path(f"/proc/{worker_pid}/stat").read_text().split()[2] == "Z"


def test_idlest_cpus_avoid_busy_cores() -> None:
    """Both A/B sides go on the CPUs idlest just before the pairs: the CPUs busy least between
    two readings of /proc/stat (a process spinning on every core but one leaves that one). The
    ranking is checked on readings given here, since this machine's other load decides what a
    real reading shows; the real call returns CPUs of the affinity mask, or None where the
    threads need every CPU."""
    from pytest_llmperf.measuring.worker import busy_ticks, idlest_cpus, idlest_of

    def stat(*cpus: tuple[int, int, int]) -> str:  # (user, system, idle) ticks per CPU
        total = [sum(c[i] for c in cpus) for i in range(3)]
        rows = [f"cpu  {total[0]} 0 {total[1]} {total[2]} 0 0 0 0 0 0"]
        rows += [f"cpu{i} {u} 0 {s} {idle} 7 1 1 2 0 0" for i, (u, s, idle) in enumerate(cpus)]
        return "\n".join([*rows, "intr 12345 0 0", "ctxt 999"])

    before = busy_ticks(stat((100, 10, 500), (100, 10, 500), (100, 10, 500)))
    assert before == {0: 114, 1: 114, 2: 114}  # user + system + irq + softirq + steal; not idle, iowait
    # CPU 0 and 2 spun for the interval, CPU 1 stayed idle: CPU 1; two CPUs: 1 and the less busy.
    after = busy_ticks(stat((190, 12, 505), (101, 10, 590), (170, 30, 505)))
    assert idlest_of([0, 1, 2], before, after, 1) == (1,)
    assert idlest_of([0, 1, 2], before, after, 2) == (1, 2)
    assert idlest_of([0, 2], before, after, 1) == (2,)  # only the affinity mask's CPUs
    # All equally busy (a loaded machine): the highest number, away from CPU 0's interrupts.
    assert idlest_of([0, 1, 2], before, before, 1) == (2,)

    allowed = sorted(os.sched_getaffinity(0))
    assert idlest_cpus(len(allowed)) is None
    if len(allowed) >= 2:
        chosen = idlest_cpus(1, sample_s=0.05)
        assert chosen is not None and len(chosen) == 1 and chosen[0] in allowed


def test_stored_forms_read_back_through_json() -> None:
    trace = RunTrace(
        start_ns=1,
        prefill_done_ns=2,
        token_ns=(3, 4),
        prompt_tokens=8,
        native=NativeCounters(1.0, 8, 2.0, 2),
        token_ids=(5, 6),
    )
    assert RunTrace.from_json(json.loads(json.dumps(trace.to_json()))) == trace
    assert RunTrace.from_json(json.loads(json.dumps(dataclasses.replace(trace, native=None).to_json()))).native is None
    assert Workload.from_json(json.loads(json.dumps(WORKLOAD.to_json()))) == WORKLOAD
    # What an older side sends (every field, ``dataclasses.asdict``) is the stored form; what it
    # is sent holds no field it does not know (the newer request forms, unset, are left out).
    assert trace.to_json() == dataclasses.asdict(trace)
    old = {k: v for k, v in dataclasses.asdict(WORKLOAD).items() if k not in LATER_FIELDS}
    assert WORKLOAD.to_json() == old and Workload.from_json(old) == WORKLOAD


def test_no_message_holds_the_workload_or_the_trace(tiny_model_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The workload's stored form follows its request on a line of its own, the trace its reply."""
    sent: list[Mapping[str, object]] = []
    received: list[Mapping[str, object] | None] = []
    send, receive = Channel.send, Channel.receive

    def sending(self: Channel, *messages: Mapping[str, object]) -> bool:
        sent.extend(messages)
        return send(self, *messages)

    def receiving(self: Channel, timeout_s: float) -> dict | None:
        received.append(receive(self, timeout_s))
        return received[-1]

    monkeypatch.setattr(Channel, "send", sending)
    monkeypatch.setattr(Channel, "receive", receiving)
    worker = WorkerEngine(config(tiny_model_path))
    try:
        trace = worker.run(WORKLOAD, 0)
    finally:
        worker.close()
    at = next(i for i, m in enumerate(sent) if m.get("op") == "run")
    assert sent[at] == {"op": "run", "run_index": 0, "workload": True}
    assert [m for m in sent if "max_tokens" in m] == [sent[at + 1]] == [WORKLOAD.to_json()]
    assert len(trace.token_ns) == WORKLOAD.max_tokens and trace.native is not None
    assert [m for m in received if m and "token_ns" in m] == [received[-1]]
    assert RunTrace.from_json(received[-1] or {}) == trace and received[-2] is not None and received[-2]["ok"]
