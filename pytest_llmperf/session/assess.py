"""A measurement against its baseline: the fingerprint of its engine, the record it makes,
the stored baselines (read once per file) and the verdict (the judged part of its
``judge.result.Outcome``), and the lines that fail a test."""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

from ..baselines import store, tracked
from ..baselines.store import BaselineError
from ..core.documents import JSONValue
from ..core.fingerprint import Fingerprint, hardware, subject
from ..core.progress import current
from ..engines.capabilities import times_layers
from .options import SessionSettings

if TYPE_CHECKING:
    from ..baselines.tracked import Committed
    from ..core.measurement import Measurement, Peak
    from ..core.workload import EngineInfo
    from ..engines import TokenStream
    from ..engines.capabilities import Engine
    from ..history.series import Windows
    from ..judge.regression import CompareSettings
    from ..judge.result import BaselineVerdict, Outcome
    from .options import MarkerConfig

#: ``fn(hardware, subject, engine_info)``: edits the fingerprint in place (the pytest layer's
#: ``pytest_llmperf_fingerprint``); raises LLMPerfError for a wrong edit.
FingerprintHook = Callable[[dict[str, JSONValue], dict[str, JSONValue], "EngineInfo"], None]


class MeasureOptions(TypedDict, total=False):
    """What to measure besides the runs (``runner.measure``'s keywords)."""

    layers: bool
    attribution: bool
    peaks: tuple[Peak, Peak] | None


class Assessor:
    """Per session: fingerprints per engine, baseline files read once, machine peaks probed once."""

    def __init__(self, settings: SessionSettings, started_at: str, fingerprint_hook: FingerprintHook) -> None:
        self.settings = settings
        self.started_at = started_at
        self.fingerprint_hook = fingerprint_hook
        self.baselines_read: dict[Path, dict[str, dict[str, Measurement]] | BaselineError] = {}
        self.fingerprints: dict[EngineInfo, Fingerprint] = {}
        self.hardware: dict[str, JSONValue] | None = None
        self.peaks: tuple[Peak, Peak] | None = None
        #: The history's recent sessions per hardware key, read once (None: it cannot be read).
        self.windows: dict[str, Windows | None] = {}
        #: Why the history could not be read for the verdicts (one line), else None.
        self.history_error: str | None = None
        #: The history cannot be used this session (a damaged file, a server not reached): it is
        #: not tried again at the end (its one line was said).
        self.history_unusable = False

    def window(self, hardware_key: str) -> Windows | None:
        """The history's windows for this hardware (read on first use, once per session), or
        None when there is no history or it cannot be read (the verdicts then use the
        baseline files alone; ``history_error`` says why)."""
        s = self.settings
        if s.history is None or s.disable or self.history_unusable:  # unusable: said once, not tried again
            return None
        if hardware_key not in self.windows:
            from ..history.database import HistoryError
            from ..history.series import read_windows
            from ..judge.rule import JUDGED

            try:
                windows = self.windows[hardware_key] = read_windows(s.history, hardware_key, [m.name for m in JUDGED])
                self.history_error = self.history_error or windows.skipped
            except HistoryError as exc:
                self.windows[hardware_key] = None
                self.history_unusable = self.history_unusable or exc.lasting
                # Lasting (damaged, not reached, still locked): not tried again, so this is the write's line too.
                line = f"history not written: {exc}" if exc.lasting else f"{exc}"
                line += "; the verdicts used the baseline files alone"
                self.history_error = f"llmperf: {line}"
        return self.windows[hardware_key]

    def fingerprint(self, m: Measurement) -> Fingerprint:
        if m.engine not in self.fingerprints:
            if self.hardware is None:
                self.hardware = hardware()
            hw, subj = dict(self.hardware), subject(m.engine)
            self.fingerprint_hook(hw, subj, m.engine)  # conftest/plugins add their keys
            self.fingerprints[m.engine] = Fingerprint(hw, subj)
        return self.fingerprints[m.engine]

    def baselines(self, path: Path) -> dict[str, dict[str, Measurement]]:
        if path not in self.baselines_read:
            try:
                self.baselines_read[path] = store.load_records(path)
            except BaselineError as exc:
                self.baselines_read[path] = exc
        loaded = self.baselines_read[path]
        if isinstance(loaded, BaselineError):
            raise loaded
        return loaded

    def assess(
        self, nodeid: str, module: Path, m: Measurement, marker: MarkerConfig, *, family_size: int, peers: int
    ) -> Outcome:
        """The judged part of the outcome of ``m`` (test ``nodeid`` in file ``module``): its
        record, baseline file and entry and, unless only budgets gate, its verdict against the
        stored baseline (``Measurer`` adds its figures and budgets)."""
        from ..baselines.records import stored
        from ..judge.regression import CompareSettings
        from ..judge.result import Outcome

        s = self.settings
        fp = self.fingerprint(m)
        rec = stored(m, fp, commit=commit(s.rootdir), recorded_at=self.started_at)
        if s.compare or s.update_baselines:
            from ..measuring.roofline import probe_reference

            current().step("the machine's reference figure (a BLAS probe)")
            rec = dataclasses.replace(rec, reference=probe_reference())  # after the runs: never inside a timed region
            current().step("judging")
        rel = module_path(module, s.rootdir)
        path = store.module_file(s.baseline_dir, rel)
        key = store.entry_key(nodeid, m.label)
        baseline_file = path.relative_to(s.baseline_dir).as_posix()
        assessment = Outcome(key, key=key, baseline_file=baseline_file, hardware_key=fp.hardware_key, record=rec)
        if not s.compare:
            return assessment
        settings = CompareSettings(
            **{**s.compare_values, **marker.settings}, family_size=family_size or None, peers=peers
        )
        return self._judged(assessment, rec, nodeid, m.label or "", path, rel, settings)

    def _judged(
        self, a: Outcome, rec: Measurement, nodeid: str, label: str, path: Path, rel: str, settings: CompareSettings
    ) -> Outcome:
        """``a`` with its verdict against its entry in the baseline file ``path`` (module ``rel``),
        the history's levels of the test beside it, and the entry it was compared against."""
        from ..judge.regression import judge
        from ..judge.result import BaselineVerdict
        from ..judge.verdict import BaselineStatus

        windows = self.window(a.hardware_key)
        test = store.unique_test_id(nodeid, a.baseline_file)  # the history's id
        window = None if windows is None else (lambda entry: windows.levels(test, label, entry))
        try:
            entries = self.baselines(path).get(a.key)
            verdict = judge(entries, a.hardware_key, rec, settings, window)
        except BaselineError as exc:
            error = BaselineVerdict(BaselineStatus.ERROR, str(exc)).decided()
            if self.settings.update_baselines:
                error = dataclasses.replace(error, note=recording_note(error))
            return dataclasses.replace(a, verdict=error)
        if verdict.status == BaselineStatus.COMPARED:
            assert entries is not None  # judged against one of them
            return dataclasses.replace(a, verdict=verdict, baseline_record=entries[a.hardware_key])
        if self.settings.update_baselines:
            verdict = dataclasses.replace(verdict, note=recording_note(verdict))
        if verdict.status == BaselineStatus.NO_BASELINE:
            return self._no_baseline(dataclasses.replace(a, verdict=verdict), path, rel)
        return dataclasses.replace(a, verdict=verdict)

    def _no_baseline(self, a: Outcome, path: Path, rel: str) -> Outcome:
        """A test without a baseline: lost (the last commit holds one for it on this machine: an
        error, the line that fails the test, or under ``--llmperf-lost-baseline=warn`` its note),
        or new (for a module outside the rootdir, the note says where older versions kept it)."""
        from ..judge.verdict import BaselineStatus

        assert a.verdict is not None
        s = self.settings
        where = s.baseline_dir.relative_to(s.rootdir) if s.baseline_dir.is_relative_to(s.rootdir) else s.baseline_dir
        module = path_of_module(s.rootdir, rel)
        lost = None if s.update_baselines else tracked.committed(module, str(where), a.key, a.hardware_key)
        if lost is not None:
            status = BaselineStatus.ERROR if s.lost_baseline == "fail" else BaselineStatus.NO_BASELINE
            verdict = dataclasses.replace(a.verdict, status=status, note=lost_note(path, lost, s.rootdir)).decided()
            return dataclasses.replace(a, verdict=verdict)
        if rel.startswith("../"):
            note = legacy_note(s.baseline_dir, path, rel, a.verdict.note)
            return dataclasses.replace(a, verdict=dataclasses.replace(a.verdict, note=note))
        return a

    def measure_options(self, engine: Engine | TokenStream, marker: MarkerConfig) -> MeasureOptions:
        """What to measure besides the runs: per-layer timing, the attribution pass and the
        roofline (in-process only; a marker's ``layers=True`` or ``attribution=True`` on another
        engine is an error the runner reports)."""
        s = self.settings
        in_process = times_layers(engine)  # the engine's declared capability
        layers = marker.options.get("layers", s.layers and in_process)
        attribution = marker.options.get("attribution", s.attribution and in_process)
        wants_roofline = layers or "min_mbu" in marker.budgets or s.roofline or s.peak_bw or s.peak_tflops
        peaks = None
        if wants_roofline and in_process:
            from ..measuring.roofline import machine_peaks

            if self.peaks is None:
                self.peaks = machine_peaks(given_bw_gbs=s.peak_bw, given_tflops=s.peak_tflops)
            peaks = self.peaks
        return {"layers": layers, "attribution": attribution, "peaks": peaks}

    def failure_lines(self, assessment: Outcome) -> list[str]:
        """What fails the test on its baseline's account (none while updating baselines)."""
        from ..judge.verdict import BaselineStatus

        v, s = assessment.verdict, self.settings
        if v is None or s.update_baselines:
            return []  # updating: the run is recorded as the new baseline (an unreadable file is moved aside)
        if v.status == BaselineStatus.ERROR:
            return [v.note]
        if v.status == BaselineStatus.NO_BASELINE and s.require_baseline:
            return [f"{assessment.key}: {v.note} (--llmperf-require-baseline)"]
        if v.status == BaselineStatus.OTHER_HARDWARE and s.strict_env:
            return [f"{v.note} (--llmperf-strict-env)"]
        return list(v.failures)


#: What a verdict's note says instead of its advice to record a baseline, in the run that records it.
RECORDING = "this run records the new baseline (--llmperf-update-baselines)"


def recording_note(verdict: BaselineVerdict) -> str:
    """``verdict``'s note in a ``--llmperf-update-baselines`` run: what the run does instead
    of advice to run it (``no baseline: run with --llmperf-update-baselines`` would tell the
    test to run the very update it is in)."""
    from ..judge.verdict import BaselineStatus

    if not verdict.note:
        return verdict.note
    if verdict.status is BaselineStatus.NO_BASELINE:
        return f"no baseline yet: {RECORDING}"
    kept = [part for part in verdict.note.split("; ") if "--llmperf-update-baselines" not in part]
    return "; ".join([*kept, RECORDING]) if len(kept) < len(verdict.note.split("; ")) else verdict.note


def module_path(module: Path | str, rootdir: Path | str) -> str:
    """The test module's path relative to the rootdir (POSIX form), ``../`` where the module is
    outside it (``--rootdir`` elsewhere), absolute where no relative path exists (another drive)."""
    module, root = Path(module).resolve(), Path(rootdir).resolve()
    try:
        return module.relative_to(root).as_posix()
    except ValueError:
        pass
    try:
        return Path(os.path.relpath(module, root)).as_posix()
    except ValueError:  # pragma: no cover - Windows, another drive
        return module.as_posix()


def path_of_module(rootdir: Path, rel: str) -> Path:
    """``module_path``'s inverse: the module's file from its path relative to the rootdir."""
    return Path(rel) if Path(rel).is_absolute() else Path(rootdir) / rel


def lost_note(path: Path, lost: Committed, rootdir: Path) -> str:
    """The line of a test whose baseline the last commit holds but that finds none at ``path``:
    the working tree's file lost it (restore it), or the baselines are looked for elsewhere now
    (the rootdir or the baseline folder moved: give the folder back, or move the file)."""
    head = lost.top / lost.path
    keep = "--llmperf-lost-baseline=warn: pass with this line"
    if path.resolve() == head.resolve():
        return (
            f"baseline lost: {lost.path} at HEAD holds this test's baseline for this machine, the working tree's "
            f"has none; restore it (git checkout HEAD -- {lost.path}) or, if dropping it is meant, record a new one "
            f"with --llmperf-update-baselines ({keep})"
        )
    return (
        f"baseline lost: no baseline in {path}, but {lost.path} at HEAD holds this test's for this machine: the "
        f"rootdir ({rootdir}) or llmperf_baseline_dir is not the one it was recorded with; run with those, or move "
        f"the file to where it is looked for ({keep})"
    )


def legacy_note(baseline_dir: Path, path: Path, rel: str, note: str) -> str:
    """A module outside the rootdir: older versions wrote ``baselines/<file name>.json``
    (shared by same-named modules, so never read now); say where it is when one is there."""
    old = store.module_file(baseline_dir, Path(rel).name)
    if not old.is_file():
        return note
    new = path.relative_to(baseline_dir).as_posix()
    return (
        f"{note} (into {new}; {old.relative_to(baseline_dir).as_posix()} is where older versions kept the "
        f"baselines of every module named {Path(rel).name} outside the rootdir: git mv it to {new} if it is "
        "this module's)"
    )


@functools.cache
def commit(root: Path) -> str | None:
    """The commit a record names (12 hex digits; ``history.database.commit_sha``), looked up once."""
    from ..history.database import commit_sha

    sha = commit_sha(root)
    return sha[:12] if sha else None
