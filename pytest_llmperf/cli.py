"""``llmperf`` command line.

- ``llmperf compare BASE.json NEW.json``: the plugin's statistics between two saved session
  reports (``pytest --llmperf-json``); exit 1 on any regression, 2 on unusable input.
- ``llmperf model [PRESET]``: write (once) a synthetic model and print its path.
"""

from __future__ import annotations

import argparse
import sys
from typing import Sequence

from .errors import LLMPerfError
from .synthetic import PRESETS, ensure_model


def _compare(args: argparse.Namespace) -> int:
    from .compare import METRICS
    from .regression import CompareSettings, judge
    from .session import comparison_table, load_session, verdict_dict

    base = {r["test"]: r for r in load_session(args.base)}
    new = load_session(args.new)
    matched = [r for r in new if r["test"] in base]
    settings = CompareSettings(
        alpha=args.alpha,
        threshold=args.threshold,
        tail_threshold=args.tail_threshold,
        family_size=max(len(matched), 1) * len(METRICS),
        fail_unstable=args.fail_unstable,
    )
    results, notes, failures = [], [], []
    regressed = 0
    for r in new:
        old = base.get(r["test"])
        if old is None:
            notes.append(f"{r['test']}: not in {args.base}")
            continue
        hw_key = r["hardware_key"] if args.any_hardware else old["hardware_key"]
        verdict = judge({hw_key: old["record"]}, r["hardware_key"], r["record"], settings)
        if verdict.note:
            notes.append(f"{r['test']}: {verdict.note}")
        results.append({"test": r["test"], "verdict": verdict_dict(verdict)})
        lines = verdict.failure_lines()
        regressed += bool(lines)
        failures += [f"{r['test']}: {line}" for line in lines]
    for test in sorted(set(base) - {r["test"] for r in new}):
        notes.append(f"{test}: not in {args.new}")
    table = comparison_table(results)
    print(table if table else "nothing to compare")
    for line in notes + failures:
        print(line)
    print(f"{regressed} regression(s) in {len(results)} compared measurement(s)")
    return 1 if failures else 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="llmperf", description="LLM inference performance tools")
    sub = parser.add_subparsers(dest="command", required=True)

    model = sub.add_parser("model", help="write (once) and print the path of a synthetic model")
    model.add_argument("preset", nargs="?", default="tiny", choices=sorted(PRESETS))

    compare = sub.add_parser("compare", help="compare two saved session reports (pytest --llmperf-json)")
    compare.add_argument("base", help="the baseline session report")
    compare.add_argument("new", help="the candidate session report")
    compare.add_argument("--alpha", type=float, default=0.01, help="family-wise significance level")
    compare.add_argument("--threshold", type=float, default=0.05, help="smallest median change that counts")
    compare.add_argument("--tail-threshold", type=float, default=0.10, help="smallest ITL p95 change that counts")
    compare.add_argument("--fail-unstable", action="store_true", help="count UNSTABLE comparisons as failures")
    compare.add_argument(
        "--any-hardware", action="store_true", help="compare even when the reports come from different hardware"
    )

    args = parser.parse_args(argv)
    try:
        if args.command == "model":
            print(ensure_model(args.preset))
            return 0
        return _compare(args)
    except LLMPerfError as exc:
        print(f"llmperf: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
