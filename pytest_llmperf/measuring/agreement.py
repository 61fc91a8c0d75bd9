"""Output agreement of an A/B's two sides: do they produce the same tokens and distributions?

Over the A/B's prompts (the workload's prompt; a synthetic one also under ``PROMPTS - 1``
further seeds), each side's engine gives, outside every timed region (after the interleaved
runs), its greedy continuation and its next-token logits (``engines.llama_cpp``'s
``token_logits``, or the engine worker's):

- greedy parity: the share of positions where B's greedy token is A's, and the first position
  where they part (B runs free on its own tokens, as a user would see it);
- teacher-forced on A's greedy tokens (both sides read the same token ids, in one batch each):
  top-1 agreement, the share of positions where B's most likely next token is A's, and the KL
  divergence KL(P_A || P_B) of B's next-token distribution from A's, A the base, as
  ``llama-perplexity --kl-divergence`` computes it: mean, p99 and max over positions.

The math is float64 log-softmax over the whole vocabulary. Identical logits give KL exactly 0
and agreement exactly 1 (log P_A - log P_B is 0.0 term by term); otherwise KL >= 0 (Gibbs'
inequality), so a rounding residue below 0 is clipped to 0. The positions are those of the
first ``TOKENS`` generated tokens per prompt (``max_tokens`` when smaller).

A served side (``engines.http``: llama-server's own ``/completion`` with ``n_probs``, with token
ids) gives only its top-k log-probabilities per position, and takes the prompt as token ids
from the other side. Then the figures are approximate, labelled ``approx (top-k=K)``: KL over
the tokens whose probabilities both sides gave, plus one bucket for the rest of each
distribution. Coarse-graining never raises KL (the log-sum inequality), so the approximation
is a lower bound of the full-vocabulary KL; top-1 agreement stays exact (each side's top token
is its first).

A side that cannot expose token probabilities (a callable, an engine that is no
``engines.capabilities.TokenProbabilities``) gives an ``Agreement`` that says so; sides with different
vocabularies or tokenizations likewise. No pytest."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from ..core.measurement import EXACT, Agreement
from ..core.workload import TokenLogits, Workload
from ..engines.capabilities import NeedsPromptIds, TokenProbabilities

#: Prompts compared for a synthetic prompt (the workload's and further seeds); a literal one: 1.
PROMPTS = 4
#: Generated positions compared per prompt, at most.
TOKENS = 64


def log_softmax(logits: npt.ArrayLike) -> npt.NDArray[np.float64]:
    """Row-wise log-softmax in float64."""
    x = np.asarray(logits, dtype=np.float64)
    shifted = x - x.max(axis=-1, keepdims=True)
    out: npt.NDArray[np.float64] = shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
    return out


def kl_rows(logits_a: npt.ArrayLike, logits_b: npt.ArrayLike) -> npt.NDArray[np.float64]:
    """KL(P_A || P_B) per row (A the base), float64, >= 0."""
    la, lb = log_softmax(logits_a), log_softmax(logits_b)
    kl = (np.exp(la) * (la - lb)).sum(axis=-1)
    out: npt.NDArray[np.float64] = np.maximum(kl, 0.0)  # Gibbs: KL >= 0; only rounding goes below
    return out


def first_divergence(a: Sequence[int], b: Sequence[int]) -> int | None:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)


def prompts(workload: Workload, n_prompts: int = PROMPTS, n_tokens: int = TOKENS) -> list[Workload]:
    """The workloads whose prompts are compared: the workload's own, and for a synthetic prompt
    ``n_prompts - 1`` more under the next seeds; ``max_tokens`` at most ``n_tokens``."""
    base = dataclasses.replace(workload, max_tokens=min(workload.max_tokens, n_tokens), runs=1, warmup=0)
    count = 1 if workload.prompt is not None else n_prompts
    return [dataclasses.replace(base, seed=workload.seed + k) for k in range(count)]


def _row(t: TokenLogits, full: npt.NDArray[np.float64] | None, i: int) -> dict[int, float] | None:
    """Row i's known log-probabilities by token id (None: the whole vocabulary, in ``full``)."""
    if t.logits is not None:
        return None
    ids, logprobs = _top_k(t)
    return {int(k): float(lp) for k, lp in zip(ids[i], logprobs[i]) if k >= 0}


def _top(t: TokenLogits, full: npt.NDArray[np.float64] | None, i: int) -> int:
    if full is not None:
        return int(np.argmax(full[i]))
    ids, logprobs = _top_k(t)
    return int(ids[i][int(np.argmax(logprobs[i]))])


def _top_k(t: TokenLogits) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float64]]:
    """The top-k of a side without ``logits`` (a served model sends them instead)."""
    if t.top_ids is None or t.top_logprobs is None:
        raise TypeError("token probabilities without logits or top-k")
    return t.top_ids, t.top_logprobs


def approx_kl_rows(pa: TokenLogits, pb: TokenLogits) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """(KL(P_A || P_B) per row, top-1 equal per row) where a side gave only its top-k: over the
    tokens known on both sides plus one bucket for the rest (module docstring). A row a side
    sent nothing for (llama-server holds back a byte token's probabilities) is NaN in both."""
    la = log_softmax(pa.logits) if pa.logits is not None else None
    lb = log_softmax(pb.logits) if pb.logits is not None else None
    kl: list[float] = []
    same: list[float] = []
    for i in range(len(pa.greedy_ids)):
        ka, kb = _row(pa, la, i), _row(pb, lb, i)
        if ka == {} or kb == {}:
            kl.append(float("nan"))
            same.append(float("nan"))
            continue
        kl.append(_bucketed_kl(*_known_logprobs(ka, kb, la, lb, i)))
        same.append(float(_top(pa, la, i) == _top(pb, lb, i)))
    return np.array(kl), np.array(same)


def _known_logprobs(
    ka: dict[int, float] | None,
    kb: dict[int, float] | None,
    la: Any,  # NDArray[float64] where ka is None (the caller's pairing), else None
    lb: Any,
    i: int,
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """Both sides' log-probabilities at row ``i`` of the tokens both gave (``ka``/``kb``: a
    side's top-k by token id; None: the side gave the whole vocabulary, in ``la``/``lb``)."""
    common = list(kb or {}) if ka is None else [t for t in ka if kb is None or t in kb]
    lpa = np.array([la[i, t] if ka is None else ka[t] for t in common])
    lpb = np.array([lb[i, t] if kb is None else kb[t] for t in common])
    return lpa, lpb


def _bucketed_kl(lpa: npt.NDArray[np.float64], lpb: npt.NDArray[np.float64]) -> float:
    """KL over the known tokens plus one bucket for the rest of each distribution."""
    rest_a = max(1.0 - float(np.exp(lpa).sum()), 0.0)
    rest_b = max(1.0 - float(np.exp(lpb).sum()), 1e-12)
    value = float((np.exp(lpa) * (lpa - lpb)).sum()) + (rest_a * np.log(rest_a / rest_b) if rest_a > 0 else 0.0)
    return max(value, 0.0)  # >= 0 but for the servers' rounding of their log-probabilities


def unavailable(a: object, b: object, a_name: str = "A", b_name: str = "B") -> str:
    """Why agreement cannot be computed for these sides ("" when it can): a side without
    ``TokenProbabilities``, or two sides that both need the prompt's token ids."""
    for side, name, engine in (("A", a_name, a), ("B", b_name, b)):
        if not isinstance(engine, TokenProbabilities):
            return f"side {side} [{name}] exposes no token probabilities"
    if isinstance(a, NeedsPromptIds) and isinstance(b, NeedsPromptIds):
        return "both sides are endpoints: neither gives the prompt's token ids"
    return ""


def compare_outputs(
    a: object, b: object, workload: Workload, *, a_name: str = "A", b_name: str = "B", n_prompts: int = PROMPTS
) -> Agreement:
    """B's greedy tokens and next-token distributions against A's over the workload's prompts
    (module docstring; ``n_prompts`` for a synthetic prompt). Call after every timed run of both
    sides. A side without ``TokenProbabilities`` gives an ``Agreement`` that says so."""
    reason = unavailable(a, b, a_name, b_name)
    if reason:
        return Agreement(reason=reason)
    assert isinstance(a, TokenProbabilities) and isinstance(b, TokenProbabilities)  # unavailable() said so
    scored: list[Scored] = []
    for w in prompts(workload, n_prompts):
        read = _read_both(a, b, w, a_name, b_name)
        if isinstance(read, str):
            return Agreement(reason=read)
        scored.append(Scored.of(*read))
    return _agreement(scored)


def _read_both(
    a: TokenProbabilities, b: TokenProbabilities, w: Workload, a_name: str, b_name: str
) -> tuple[TokenLogits, TokenLogits] | str:
    """A's token probabilities of one prompt and B's teacher-forced on A's greedy tokens; a
    side that ``NeedsPromptIds`` gets the other side's tokenization. A string: why not."""
    ids = None
    if isinstance(a, NeedsPromptIds):  # an endpoint: the other side's tokenization of the prompt
        lead = b.token_logits(w)
        if isinstance(lead, str):
            return f"side B [{b_name}]: {lead}"
        ids = lead.prompt_ids
    pa = a.token_logits(w) if ids is None else a.token_logits(w, prompt_ids=ids)
    if isinstance(pa, str):
        return f"side A [{a_name}]: {pa}"
    if isinstance(b, NeedsPromptIds):
        pb = b.token_logits(w, forced=pa.greedy_ids, prompt_ids=pa.prompt_ids)
    else:
        pb = b.token_logits(w, forced=pa.greedy_ids)
    if isinstance(pb, str):
        return f"side B [{b_name}]: {pb}"
    return _apart(pa, pb) or (pa, pb)


def _apart(pa: TokenLogits, pb: TokenLogits) -> str:
    """Why the two sides' positions cannot be compared ("" when they can)."""
    if pa.logits is not None and pb.logits is not None and pa.logits.shape[1] != pb.logits.shape[1]:
        return f"the sides' vocabularies differ (A {pa.logits.shape[1]}, B {pb.logits.shape[1]})"
    if pa.prompt_ids != pb.prompt_ids:
        return "the sides tokenize the prompt differently (not one vocabulary)"
    return ""


@dataclass(frozen=True)
class Scored:
    """One prompt's positions compared: KL per scored position, top-1 matches, positions a
    side held back, the top-k of a side that gave only that (0: both gave the whole
    vocabulary), equal greedy tokens of how many, and where the greedy tokens first part."""

    kl: npt.NDArray[np.float64]  # KL per scored position
    top1: int
    unscored: int
    k: int
    same_greedy: int
    generated: int
    divergence: int | None

    @classmethod
    def of(cls, pa: TokenLogits, pb: TokenLogits) -> Scored:
        if pa.logits is not None and pb.logits is not None:
            kl = kl_rows(pa.logits, pb.logits)
            top1 = int((np.argmax(pa.logits, axis=1) == np.argmax(pb.logits, axis=1)).sum())
            unscored = k = 0
        else:
            rows, same = approx_kl_rows(pa, pb)
            scored = np.isfinite(rows)
            kl, top1, unscored = rows[scored], int(same[scored].sum()), int((~scored).sum())
            k = max(_top_k(t)[0].shape[1] for t in (pa, pb) if t.logits is None)
        return cls(
            kl,
            top1,
            unscored,
            k,
            sum(x == y for x, y in zip(pa.greedy_ids, pb.greedy_ids)),
            len(pa.greedy_ids),
            first_divergence(pa.greedy_ids, pb.greedy_ids),
        )


def _agreement(scored: Sequence[Scored]) -> Agreement:
    """The prompts' positions together."""
    values = np.concatenate([s.kl for s in scored])
    n = int(values.size)
    unscored = sum(s.unscored for s in scored)
    if not n:
        return Agreement(reason=f"no position had both sides' probabilities ({unscored} held back)")
    k = max(s.k for s in scored)
    return Agreement(
        n_unscored=unscored,
        method=f"approx (top-k={k})" if k else EXACT,
        n_prompts=len(scored),
        n_positions=n,
        top1_agreement=sum(s.top1 for s in scored) / n,
        kl_mean=float(values.mean()),
        kl_p99=float(np.percentile(values, 99)),
        kl_max=float(values.max()),
        greedy_parity=sum(s.same_greedy for s in scored) / sum(s.generated for s in scored),
        first_divergence=tuple(s.divergence for s in scored),
    )
