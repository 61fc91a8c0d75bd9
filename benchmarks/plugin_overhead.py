"""What the installed plugin costs a project with no llmperf test: pytest wall time over 200
plain tests with the plugin against ``-p no:llmperf``, side by side.

    python benchmarks/plugin_overhead.py [--tests 200] [--repeats 5]

Each repeat runs both variants back to back (alternating which goes first), so a busy machine
slows both alike; the figure is the difference of the medians. The budget (issue 10) is
0.15 s per run. The checkout's code is measured (its root goes first on PYTHONPATH); when the
package is not installed as a pytest plugin, ``-p pytest_llmperf.pytest_plugin.plugin`` loads it.

Then the plugin's own import: CPU time of ``import pytest_llmperf.pytest_plugin.plugin`` after
``import pytest``, one fresh process each, the lowest of ``--repeats`` (CPU time, so a busy
machine barely moves it), and how many of the package's modules it loads. Issue 48 on a
shared 2-core machine, compiled bytecode as here (source only, PYTHONDONTWRITEBYTECODE=1, in
brackets): 42 to 49 ms [99 to 106] and 30 modules before it, 89 to 98 ms [180 to 198] and 46
once the imports moved to the tops of their modules, 53 to 61 ms [123 to 149] and 40 once the
measuring session's modules (asyncio, core.measurement, measuring.*) stayed out of pytest's
start. The CPU overhead of a whole run of 20 plain tests went with it: +0.31 s, +0.56 s, +0.31 s.
"""

from __future__ import annotations

import argparse
import compileall
import os
import statistics
import subprocess
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BUDGET_S = 0.15


def installed_as_plugin() -> bool:
    return any(ep.name == "llmperf" for ep in metadata.entry_points(group="pytest11"))


def run_once(project: Path, args: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(wall seconds, CPU seconds user+sys) of one pytest run. CPU time barely moves when
    other processes share the machine; wall time is what the budget is about."""
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args]
    started = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=project, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    elapsed = time.perf_counter() - started
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"pytest failed ({' '.join(args) or 'plugin on'}):\n{out.decode()[-3000:]}")
    return elapsed, usage.ru_utime + usage.ru_stime


IMPORT_COST = """
import resource, sys
import pytest
before = resource.getrusage(resource.RUSAGE_SELF)
import pytest_llmperf.pytest_plugin.plugin
after = resource.getrusage(resource.RUSAGE_SELF)
cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
print(cpu, sum(m.startswith("pytest_llmperf.") for m in sys.modules))
"""


def import_cost(env: dict[str, str], repeats: int) -> tuple[float, int]:
    """(lowest CPU seconds, modules of the package) of importing the plugin after pytest."""
    cmd = [sys.executable, "-c", IMPORT_COST]
    figures = [
        subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stdout.split() for _ in range(repeats)
    ]
    return min(float(cpu) for cpu, _ in figures), int(figures[0][1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tests", type=int, default=200, help="plain tests in the project (default 200)")
    parser.add_argument("--repeats", type=int, default=5, help="runs of each variant (default 5)")
    args = parser.parse_args()

    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    env.pop("PYTEST_ADDOPTS", None)
    with_plugin = [] if installed_as_plugin() else ["-p", "pytest_llmperf.pytest_plugin.plugin"]
    without = ["-p", "no:llmperf"] if installed_as_plugin() else []
    # An installed package has its bytecode compiled (pip does it); this machine sets
    # PYTHONDONTWRITEBYTECODE, which would otherwise charge a source compile to every run.
    compileall.compile_dir(str(ROOT / "pytest_llmperf"), quiet=1)
    with tempfile.TemporaryDirectory(prefix="llmperf-overhead-") as tmp:
        project = Path(tmp)
        (project / "pytest.ini").write_text("[pytest]\n")
        body = "".join(f"def test_plain_{i}():\n    assert {i} + 1 == {i + 1}\n\n" for i in range(args.tests))
        (project / "test_plain.py").write_text(body)
        run_once(project, with_plugin, env)  # warm the file cache; not counted
        on, off = [], []
        for i in range(args.repeats):
            pair = [(on, with_plugin), (off, without)]
            for times, extra in pair if i % 2 == 0 else reversed(pair):
                times.append(run_once(project, extra, env))
    print(f"{args.tests} plain tests, median of {args.repeats} runs each, {sys.executable}")
    verdicts = []
    for kind, i in (("wall", 0), ("CPU", 1)):
        t_on, t_off = [t[i] for t in on], [t[i] for t in off]
        overhead = statistics.median(t_on) - statistics.median(t_off)
        verdicts.append(overhead <= BUDGET_S)
        print(
            f"  {kind:4} with the plugin ({' '.join(with_plugin) or 'installed'}): {statistics.median(t_on):.3f} s "
            f"[{', '.join(f'{t:.3f}' for t in t_on)}]"
        )
        print(
            f"  {kind:4} without it ({' '.join(without) or 'not loaded'}): {statistics.median(t_off):.3f} s "
            f"[{', '.join(f'{t:.3f}' for t in t_off)}]"
        )
        print(
            f"  {kind:4} overhead: {overhead:+.3f} s per run (budget {BUDGET_S:.2f} s): "
            f"{'ok' if overhead <= BUDGET_S else 'OVER'}"
        )
    cpu, modules = import_cost(env, args.repeats)
    print(
        f"  plugin import after pytest: {cpu * 1e3:.0f} ms CPU (lowest of {args.repeats}), {modules} modules of the package"
    )
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"  load average {load:.1f} on {os.cpu_count()} CPUs (wall time is only meaningful on a quiet machine)")
    return 0 if verdicts[0] else 1


if __name__ == "__main__":
    sys.exit(main())
