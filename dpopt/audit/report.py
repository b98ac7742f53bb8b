"""The audit report: what was tested, what was found, and how to read it.

:class:`AuditReport` holds one audit's result; :meth:`AuditReport.to_dict` is its JSON form,
:meth:`AuditReport.lines` its text (what ``dpopt audit`` prints) and :func:`write_audit` writes
``report.json``, ``summary.md`` and ``plots/output_distributions.png`` into a directory,
atomically (:func:`dpopt.atomic.atomic_directory`), like a release.

**One vocabulary.** Every verdict starts with one outcome of :data:`OUTCOMES` -- ``EXACT
DISCLOSURE`` (a statistic published without noise: never "no violation"), ``VIOLATION`` (the
lower bound exceeds the claim), ``LEDGER ERROR`` (a run spent other than it claims) or ``NO
VIOLATION FOUND`` -- followed by the assumption it rests on, if any ("assuming the published
invariants (state totals) are public", "assuming the record count is public": the audit then
moves one record and the claim is the group guarantee of two add/remove steps). A verdict
without a violation states its power: the smallest excess over the claim its test would have
detected with 95% probability (:func:`dpopt.audit.stats.detectable_excess`).

The report describes synthetic tiny datasets only; it never holds anything from real data.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from dpopt.audit.claims import Claim
from dpopt.audit.events import Event

__all__ = ["AuditReport", "write_audit", "LIMITS", "OUTCOMES", "VIOLATION", "EXACT_DISCLOSURE", "LEDGER_ERROR",
           "NO_VIOLATION"]

#: The outcomes of an audit, strongest first: every verdict starts with one of them.
VIOLATION = "VIOLATION"
EXACT_DISCLOSURE = "EXACT DISCLOSURE"
LEDGER_ERROR = "LEDGER ERROR"
NO_VIOLATION = "NO VIOLATION FOUND"
OUTCOMES = (EXACT_DISCLOSURE, VIOLATION, LEDGER_ERROR, NO_VIOLATION)

#: What every report says about what an audit can and cannot show.
LIMITS = (
    "An audit gives a lower bound on the privacy loss, never a proof of privacy: passing means no violation "
    "was found with these runs, datasets and events.",
    "Power: the verdict states the smallest excess over the claim that its test would have detected with 95% "
    "probability; a smaller violation can pass unseen (see docs: Privacy audit).",
    "Timing and other side channels, and the randomness source itself, are out of scope (the audit's runs use "
    "a seeded generator).",
)


@dataclass(eq=False)
class AuditReport:
    """The result of :func:`dpopt.audit.audit` (see the module notes of :mod:`dpopt.audit.harness`).

    Attributes
    ----------
    target, title : str
    claim : Claim
        What was audited (under ``relation``).
    relation : str
        ``"add_remove"`` or ``"move"`` (one record moved, published-exact statistics kept).
    pair, pair_text
        The worst pair found.
    event : Event
        The event tested; ``larger`` the dataset it favours.
    k_a, n_a, k_b, n_b : int
        Hits and runs of the test on each dataset.
    epsilon_lower_bound : float
        One-sided Clopper–Pearson lower bound on ε at confidence ``1 - alpha``.
    fisher_p : float
        p-value of "the release is (ε, δ)-DP at the claim" on this event (StatDP's Fisher test).
    exact_disclosures : list of str
        Statistics published exactly (one value per dataset, no noise).
    search, screening : list
        The best events of the search and the best screened pairs.
    ledger_runs : int
        Runs whose ledger was checked; ``ledger_problems`` the problems found, with counts.
    conditional : AuditReport or None
        The audit conditional on the record count, when the record count was disclosed.
    """

    target: str
    title: str
    claim: Claim
    relation: str
    pair: dict
    pair_text: str
    event: Event
    larger: str
    k_a: int
    k_b: int
    n_a: int
    n_b: int
    epsilon_lower_bound: float
    fisher_p: float
    alpha: float
    exact_disclosures: list
    search: list
    screening: list
    pairs_considered: str
    runs: dict
    ledger_runs: int
    ledger_problems: list
    published_exactly: list
    notes: list
    settings: dict
    statistic_a: np.ndarray = field(repr=False, default=None)
    statistic_b: np.ndarray = field(repr=False, default=None)
    conditional: "AuditReport | None" = None
    seconds: float = float("nan")
    detectable_excess: float = float("nan")
    assumed: list = field(default_factory=list)

    # ---- verdicts -------------------------------------------------------------------------
    @property
    def flagged(self) -> bool:
        """The lower bound exceeds the claimed ε: with confidence ``1 - alpha``, the claim is false."""
        return self.epsilon_lower_bound > self.claim.epsilon

    @property
    def fisher_rejects(self) -> bool:
        """Fisher's test rejects "(ε, δ)-DP at the claim" at level ``alpha`` (the second opinion)."""
        return self.fisher_p < self.alpha

    @property
    def ledger_ok(self) -> bool:
        return not self.ledger_problems

    @property
    def outcome(self) -> str:
        """This audit's own finding, in the one vocabulary of :data:`OUTCOMES` (the conditional
        audit, when there is one, has its own)."""
        if self.exact_disclosures:
            return EXACT_DISCLOSURE
        if self.flagged:
            return VIOLATION
        if not self.ledger_ok:
            return LEDGER_ERROR
        return NO_VIOLATION

    @property
    def passed(self) -> bool:
        """No violation, no exact disclosure, every ledger right (the conditional audit's too)."""
        return self.outcome == NO_VIOLATION and (self.conditional is None or self.conditional.passed)

    @property
    def count_declared_public(self) -> bool:
        """The release notes say the record count is treated as public (MWEM's and DualQuery's
        default, the papers' n): then its exact disclosure is the documented one and the verdict
        that matters is the conditional audit's. A release that measured its count with noise
        (``count_share``) does not say so, and an exact count there is a finding."""
        return any("treated as public" in n.lower() for n in self.notes)

    @property
    def total_runs(self) -> int:
        return sum(self.runs.values()) + (self.conditional.total_runs if self.conditional else 0)

    @property
    def detectable_epsilon(self) -> float:
        """The ε this test detects with 95% probability: the claim plus :attr:`detectable_excess`."""
        return self.claim.epsilon + self.detectable_excess

    def power_text(self) -> str:
        """What the test could have detected (the power statement of the verdict)."""
        n = f"{self.n_a:,} test runs per dataset"
        if math.isinf(self.detectable_excess):
            return (f"with {n} this event could not have shown any violation with 95% probability "
                    "(too few runs, or too rare an event)")
        if math.isnan(self.detectable_excess):
            return "the power of this test was not computed"
        rel = self.detectable_excess / self.claim.epsilon if self.claim.epsilon else math.inf
        return (f"with {n} this test would have detected epsilon >= {_eps(self.detectable_epsilon)} "
                f"(an excess of {self.detectable_excess:.3g} = {rel:.2f} x the claim) with 95% probability")

    def _finding(self) -> str:
        """This audit's own result in words, after its outcome word."""
        conf = f"{100 * (1 - self.alpha):g}%"
        if self.exact_disclosures:
            shown = ", ".join(self.exact_disclosures[:4]) + (" ..." if len(self.exact_disclosures) > 4 else "")
            what = "the record count is published exactly: " if self.conditional is not None else ""
            return (f"{what}{shown} take one value on every run of a dataset and another on its neighbour: no noise "
                    f"hides them, so no epsilon holds for these neighbours")
        if self.flagged:
            return (f"with {conf} confidence the release is NOT {self.claim.describe()}-DP "
                    f"(epsilon >= {_eps(self.epsilon_lower_bound)})")
        text = (f"epsilon >= {_eps(self.epsilon_lower_bound)} at {conf} confidence, within the claimed "
                f"{self.claim.epsilon:.4g} (a lower bound, not a proof); {self.power_text()}")
        if not self.ledger_ok:
            return f"{self._ledger_text()}; the outputs showed no violation: {text}"
        return text

    def _ledger_text(self) -> str:
        return f"{self.ledger_problems[0][0]} (in {sum(n for _, n in self.ledger_problems)} runs)"

    def _assumption_text(self) -> str:
        if not self.assumed:
            return ""
        group = (f"so neighbours move one record and the claim {self.claim.epsilon:.4g} is the group guarantee of "
                 f"{self.claim.text.split(';')[0]} over two add/remove steps" if self.relation == "move" else "")
        return " and ".join(self.assumed) + (f" ({group})" if group else "")

    @property
    def verdict(self) -> str:
        """The verdict: its first words are the outcome and any assumption it rests on."""
        head = self.outcome
        assumption = self._assumption_text()
        if assumption:
            head += (", assuming " if self.outcome == NO_VIOLATION else ", even assuming ") + assumption
        text = f"{head}: {self._finding()}"
        if self.ledger_problems and self.outcome != LEDGER_ERROR:
            text += f"; LEDGER ERROR: {self._ledger_text()}"
        if self.conditional is not None:
            text += ("; the release notes say the record count is treated as public" if self.count_declared_public else
                     "; the release notes do not say the record count is public")
            text += f". {self.conditional.verdict}"
        return text

    # ---- output ------------------------------------------------------------------------------
    def lines(self) -> list[str]:
        """The report as text (what ``dpopt audit`` prints): the verdict first."""
        return [f"verdict: {self.verdict}"] + self._details()

    def _details(self) -> list[str]:
        rel = {"add_remove": "datasets differing by one added or removed record",
               "move": "datasets differing by one moved record (published-exact statistics kept)"}[self.relation]
        fa, fb = self.k_a / self.n_a, self.k_b / self.n_b
        out = [
            f"audit of {self.target}" + (f" ({self.title})" if self.title else ""),
            f"  claimed: {self.claim.describe()} ({self.claim.text}), over {rel}",
            f"  worst pair: {self.pair_text}",
            f"    chosen because: {self.pair['why']} ({self.pairs_considered} considered)",
            f"  event: {self.event.label}",
            f"    test runs: {self.k_a}/{self.n_a} under a, {self.k_b}/{self.n_b} under b "
            f"(P_a = {fa:.4g}, P_b = {fb:.4g}; the event favours {self.larger})",
            f"  epsilon lower bound: {_eps(self.epsilon_lower_bound)} (one-sided Clopper-Pearson, "
            f"{100 * (1 - self.alpha):g}%" + (", delta-thinned" if self.claim.delta else "") + ")",
            f"  power: {self.power_text()} (the favoured dataset's probability held at its frequency; "
            "docs: Privacy audit, Power)",
            f"  Fisher's exact test at the claim: p = {self.fisher_p:.3g}"
            + (" (rejects)" if self.fisher_rejects else " (does not reject)"),
            f"  ledger: {self.ledger_runs} runs checked, "
            + ("every one sums exactly to the claim and charges every measurement" if self.ledger_ok else
               "; ".join(f"{msg} ({n} runs)" for msg, n in self.ledger_problems)),
        ]
        if self.exact_disclosures:
            shown = ", ".join(self.exact_disclosures[:4]) + (" ..." if len(self.exact_disclosures) > 4 else "")
            out.append(f"  EXACT DISCLOSURE: {shown} take one value on every run of a dataset and another on its "
                       "neighbour (no noise)")
        if self.published_exactly:
            out.append(f"  published exactly by declaration (kept equal between neighbours): "
                       f"{', '.join(self.published_exactly)}")
        if self.settings.get("test_sizing"):
            out.append(f"  --runs auto: {self.settings['test_sizing']}")
        if self.search:
            out.append("  best events of the search (on separate runs):")
            out += [f"    {line}" for line in self.search[:3]]
        out.append(f"  runs: {', '.join(f'{k} {v:,}' for k, v in self.runs.items())}"
                   + (f"; {self.seconds:.1f} s" if not math.isnan(self.seconds) else ""))
        if self.conditional is not None:
            out.append("  conditional on the record count (published exactly; audited again with it kept equal, "
                       "against the two-step guarantee):")
            out += ["  " + line for line in self.conditional._details()[1:]]
        return out

    def to_dict(self) -> dict:
        """JSON-ready (numbers as floats; the test runs' statistics summarised, not listed)."""
        return {
            "target": self.target, "title": self.title, "claim": self.claim.to_dict(), "relation": self.relation,
            "worst_pair": self.pair, "event": {**self.event.to_dict(), "favours": self.larger},
            "test": {"hits_a": self.k_a, "runs_a": self.n_a, "hits_b": self.k_b, "runs_b": self.n_b,
                     "p_a": self.k_a / self.n_a, "p_b": self.k_b / self.n_b},
            "epsilon_lower_bound": self.epsilon_lower_bound, "confidence": 1 - self.alpha,
            "outcome": self.outcome, "assumptions": list(self.assumed),
            "detectable_excess": _finite(self.detectable_excess),
            "detectable_epsilon": _finite(self.detectable_epsilon),
            "power": 0.95,
            "fisher_p": self.fisher_p, "flagged": self.flagged, "fisher_rejects": self.fisher_rejects,
            "exact_disclosures": list(self.exact_disclosures), "published_exactly": list(self.published_exactly),
            "search": list(self.search),
            "screening": [{"bound": b, "pair": text, "why": why} for b, text, why in self.screening],
            "pairs_considered": self.pairs_considered, "runs": dict(self.runs), "total_runs": self.total_runs,
            "ledger": {"runs_checked": self.ledger_runs, "ok": self.ledger_ok,
                       "problems": [{"problem": m, "runs": n} for m, n in self.ledger_problems]},
            "passed": self.passed, "verdict": self.verdict, "notes": list(self.notes), "limits": list(LIMITS),
            "settings": dict(self.settings), "seconds": self.seconds,
            "conditional": self.conditional.to_dict() if self.conditional is not None else None,
        }

    def markdown(self) -> str:
        """A readable summary (``summary.md``)."""
        lines = [f"# Privacy audit: {self.target}", "", f"**{self.verdict}**", "", "```", *self._details(), "```", "",
                 "## What this audit can and cannot show", ""]
        lines += [f"- {text}" for text in LIMITS]
        if self.notes:
            lines += ["", "## Notes of the algorithm", ""] + [f"- {n}" for n in self.notes]
        return "\n".join(lines) + "\n"


def _eps(value: float) -> str:
    return "inf" if math.isinf(value) else f"{value:.4f}"


def write_audit(report: AuditReport, out: str | Path, *, overwrite: bool = False, plot: bool = True) -> Path:
    """Write ``report.json``, ``summary.md`` and ``plots/output_distributions.png`` into ``out`` atomically."""
    from dpopt.atomic import atomic_directory

    with atomic_directory(out, overwrite=overwrite) as tmp:
        files = ["report.json", "summary.md"]
        data = report.to_dict()
        if plot:
            from dpopt.audit.plots import plot_worst_pair

            (tmp / "plots").mkdir()
            plot_worst_pair(report, tmp / "plots" / "output_distributions.png")
            files.append("plots/output_distributions.png")
        data["files"] = files
        (tmp / "report.json").write_text(json.dumps(data, indent=2, default=_json_default) + "\n", encoding="utf-8")
        (tmp / "summary.md").write_text(report.markdown(), encoding="utf-8")
    return Path(out)


def _finite(value: float) -> float | None:
    """A number for JSON: None where there is no finite value (nothing detectable)."""
    return float(value) if math.isfinite(value) else None


def _json_default(obj):
    if isinstance(obj, (np.integer,)):
        return int(obj)
    if isinstance(obj, (np.floating,)):
        return float(obj)
    return str(obj)
