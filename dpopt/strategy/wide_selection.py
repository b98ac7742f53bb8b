"""What to measure on a wide domain: every workload marginal, or a privately selected few.

On a domain too large for the dense table, ``auto`` answers a workload of marginals in marginal
space (:func:`dpopt.estimate.marginal_space.estimate_marginals`). Measuring every workload marginal
splits the budget ``M`` ways. Under zCDP the noise grows like ``sqrt(M)`` and that is the best plan
on the benchmarks of issue 27 at ε 1 (at ε 0.1 selection, fitted by the smooth estimate, is better:
*Which fit each mode gets*); under pure ε it grows like ``M`` and thousands of marginals are
pure noise (d = 27, all 2,925 triples at ε = 1: mean L1 error 0.17, worse than independence).
This module plans and runs the choice, in the manner of MST (McKenna, Miklau, Sheldon, "Winning
the NIST contest: a scalable and general approach to differentially private synthetic data",
JPC 2021) and AIM (McKenna, Mullins, Sheldon, Miklau, "AIM: an adaptive and iterative mechanism
for differentially private synthetic data", VLDB 2022):

1. **One-way marginals** (share ``ONE_WAY_SHARE`` of the budget): every attribute's marginal, one
   stacked measurement (Laplace under pure ε, L1 sensitivity ``d``; discrete Gaussian under zCDP,
   squared L2 sensitivity ``d``). They give the noisy total ``n^`` and the *selection model*
   ``m_C`` of every candidate set ``C``: the product of the noisy one-way marginals (negative
   noisy counts set to zero, then normalised — an internal model, never released).
2. **The decision** (share ``PROBE_SHARE``): the mean deviation of the candidates from the model,
   ``D = (1/|C|) sum_C ||M_C(x) - m_C||_1``, is released once with noise (sensitivity 1: each term
   moves by at most one when one record is added or removed, and the model reads only step 1's
   noisy output; rounded to an integer, which keeps sensitivity 1). Every workload marginal is
   measured (``mode = "all"``, the rest of the budget in equal shares) when the expected L1 noise
   of a marginal measured that way, ``E_all`` (the mean over the workload of
   ``cells x E|noise|``, :func:`expected_noise_all`), is at most ``D^``: AIM's criterion (measure
   a marginal when its expected noise error is below its expected bias, here on average over the
   workload) — or at most ``ALL_L2_NOISE_FRACTION x D^`` (1/2) when the fit of "all" would be least
   squares and every workload set has three attributes or more, or the workload holds pairs under
   pure (or approximate) ε (:func:`all_noise_fraction`, :func:`measures_all`; *Which fit each mode
   gets* and *Rounds for pairs*, below).
   Otherwise ``mode = "select"``. Beyond ``CANDIDATE_LIMIT`` candidates (d = 100, all triples: 161,700)
   the probe and selection read a pool drawn independently of the data: every pair and a uniform
   sample of the larger sets (the mean over a fixed list keeps sensitivity 1).
3. **Selection** (``mode = "select"``): first a second measurement of the one-way marginals, of
   the share :func:`one_way_top_up` derives: the minimiser of the expected L1 noise a candidate
   sees (its model's one-way part plus, if chosen, its measurement's noise), with the one-way part
   weighted by the share ``phi`` of the probe's noisy deviation that the first model's expected
   noise explains; when ``phi < TOP_UP_NOISE_FRACTION`` (1/2) real dependence dominates what
   selection ranks, a better one-way model buys little, and there is no top-up (the threshold was
   chosen on the validation networks below: ``phi`` about 0.34 on triples at d = 27, where every
   top-up lost, 0.9-1 on pairs at d = 50 and 100, where it won).
   The two one-way measurements are combined by inverse variance and the model rebuilt. Then
   ``T`` rounds (default ``T = d``: as many marginals as MST's spanning tree has edges, plus one;
   a workload of pairs takes ``2d`` when the probe says they pay, *Rounds for pairs* below),
   each with an equal part of what is left. Each round spends ``SELECT_SHARE`` of its
   part on the exponential mechanism (McSherry and Talwar 2007) over the candidates not yet
   measured — the workload's sets and their pairs — with AIM's quality score (its candidate
   score with weight one: deviation from the model minus the expected noise of measuring)::

       q_C  =  ||M_C(x) - m_C||_1  -  sqrt(2/pi) sigma_C |C cells|      (Gaussian; b_C |C cells| for Laplace)

   (L1 sensitivity 1 for the same reason; the penalty is public), then measures the chosen
   marginal with the rest of its part. The model ``m_C`` of a candidate meeting measured sets is
   updated from the noisy answers (AIM refits a graphical model; here the closed forms of the
   estimator's independence prior, :mod:`~dpopt.estimate.marginal_space.prior`: a set whose
   attributes are linked by one measured set or by a chain of two takes the product of the noisy
   measured marginals over their common attribute, e.g. ``m_abc = M_ab M_bc / M_b``; unlinked
   groups multiply), so the next round looks for what the measured marginals do not yet explain.
   With ``anneal=True`` (off by default) AIM's budget annealing (McKenna et al. 2022, Alg. 1,
   lines 13-14) doubles the rounds' share (halves their noise) after a measurement that moved the
   model by no more than its expected noise; the last round takes what is left.
   **When selection cannot pay** (the one-way fallback). The probe's deviation ``D^`` mixes real
   dependence with the one-way model's own noise; the latter's expected part is public
   (:func:`model_noise`: ``nu = mean_C min(sum_{a in C} n_a E|z_1|, 2 n^)``, first order, capped at
   the largest L1 distance between two tables of total ``n^``). When ``nu >= D^`` the probe cannot
   tell dependence from noise, and the selection's scores, which subtract only the measurement's
   noise, rank the model's noise: candidates over many-valued attributes (whose one-way noise is
   largest) win. If moreover the top-up rule at ``phi = 1`` (:func:`one_way_top_up`) finds that no
   second one-way measurement pays for selection — measuring a candidate costs more than any better
   one-way model saves, which is what many-valued attributes under pure ε give (Laplace noise on
   the one-way stack has L1 sensitivity ``d``; x = 0 is then the grid's minimiser) — then no selected
   set is expected to pay for its noise, and the rest of the budget measures the one-way marginals
   again, each workload attribute's alone with a share proportional to ``sqrt(m_a n_a)`` (``m_a``
   workload sets hold it; :func:`one_way_weights`: the least expected workload L1 under Laplace
   noise, where one stack would put scale ``d / epsilon`` on every cell); the fit combines them with
   the first measurement: ``mode = "one-way"``. The
   second condition is public, so the plan says whether the fallback is open
   (``WideSelectionPlan.one_way_fallback``). Found and validated on generated data, not adult
   (``bench_wide_rule.py --groups 1,7,3,1,7,4,1,2,6,1,7,3,1,1``: 14 attributes of 2-128 values
   merged from a network's 45 binary attributes, every triple, pure ε 0.1, networks 3 / 4 / 5,
   seeds 1-2, mean L1/n): the fallback fired in every run, 0.641 / 0.565 / 0.860 (selection) →
   0.299 / 0.284 / 0.300 (0.337 / 0.325 / 0.344 with the rest on one stack); measuring the chain
   of triples directly 0.615 / 0.545 / 0.542, the one-way stack with the whole budget 0.332 /
   0.328 / 0.342, independence from the exact one-ways (not private) 0.208 / 0.205 / 0.220. At
   ε 1 it did not fire (``nu / D^`` 0.84-0.93). On binary data a top-up pays, so the fallback is
   closed and nothing changed (pure ε 0.1 and 1, d = 27 triples, d = 50 and 100 pairs; zCDP
   unchanged everywhere). ``nu >= D^`` alone would have fired there too: better on pairs at ε 0.1
   (d = 50: 0.054 → 0.036) but worse on triples (d = 27: 0.071 → 0.090) and on pairs at ε 1 (one
   run, 0.009 → 0.021), so it is not the rule.

   The fallback is also taken when the exponential mechanism is *blind*
   (:func:`selection_is_blind`): its utility guarantee at the first round's epsilon, a pick within
   ``2 ln|C| / epsilon`` of the best (Dwork and Roth 2014, Theorem 3.11, at ``t = 0``), is wider
   than any deviation can be (``2 n^``), so the choice is not guaranteed to beat a blind one. On
   the validation grid this fires only for d = 100 binary pairs at pure ε 0.1 (network 3, seeds
   1-2): 0.092 → 0.058 (exact independence 0.011). Binary pairs at d = 50 and pure ε 0.1 stay
   with selection (0.050-0.054 where the fallback gives 0.036-0.039): open.

   **Each pick's fit stays in reach.** A fit that does not finish releases nothing after the whole
   budget is spent, so before a pick is measured the fit of the measured sets with it is checked
   (:func:`fit_in_reach`, public sizes and earlier noisy choices only: the smooth estimate's
   junction tree within ``SMOOTH_TREE_CELLS``, else least squares within
   :func:`least_squares_reach`). A pick out of reach is not measured; its measurement's share goes
   to the rounds to come, so the ledger still sums to the budget. When least squares on the
   workload's own sets is out of reach and no selection can make the fit smooth (``estimator =
   "l2"``, or a constraint the smooth estimate cannot keep), the plan is refused before any draw.
4. The caller fits every workload marginal from all these measurements
   (:func:`~dpopt.estimate.marginal_space.estimate_marginals`); the prior completes the unmeasured.

**Which fit each mode gets.** AIM's criterion compares noise only. The fits differ: selection's
few measured sets give a small junction tree, so selection is fitted by the smooth estimate
(entropy-regularised towards the prior, :mod:`~dpopt.estimate.marginal_space.smooth`), while every
workload marginal measured gives a tree whose Newton products are too large for it (binary triples
at every d tried, 18-27), so "all" is fitted by least squares, which keeps its noise. Found on generated
data (``bench_wide_rule.py``, network 3, zCDP ε 0.1, mean L1/n, seeds 1-2; least squares /
smooth on the *same* measurements): d = 16 triples (the dense table, where both fits run):
"all" 0.0124 / 0.0115, selection 0.1100 / 0.0109 — with the same fit the two modes are level;
d = 21 triples (seed 1): "all" 0.0185 (least squares: the only fit in reach), selection 0.0309 / 0.0104;
d = 27 triples: "all" 0.0268 (least squares), selection smooth 0.0095. So when the fit of "all"
would be least squares (:func:`measure_all_fit`, public sizes and options), "all" needs its expected
noise at most ``ALL_L2_NOISE_FRACTION = 1/2`` of the probe's deviation; a smooth fit of "all" keeps
AIM's criterion, and so does ``estimator = "l2"``, which fits selection by least squares too
(:func:`all_noise_fraction`; there the evidence is mixed: d = 27, selection 0.0246 against "all"
0.0268; d = 21, 0.0309 against 0.0185). The half is a judgement between two groups of runs on
the validation grid (networks 3-5, seeds 1-2; ``E_all / D^`` is public in the plan and noisy-released
in the run): where "all" (least squares) won, at zCDP ε 1, ``E_all / D^`` was 0.08-0.12 (d = 27
triples, d = 50 pairs) and 0.36-0.42 (d = 100 pairs: "all" 0.0024 against selection 0.0050,
network 3); where selection won, at zCDP ε 0.1, it was 0.77-0.90 (d = 27) and 0.87-0.99 (d = 50).
It is not derived: the error selection leaves is what its smooth fit cannot explain (on these
networks 0.08-0.4 of ``D^``), which no public quantity gives before the draws. **Between the grid's
budgets the half is not right everywhere** (network 3, seeds 1-2, zCDP, "all" / selection, the
ratio ``E_all / D^``): d = 27 triples at ε 0.15 (0.61) 0.0183 / 0.0072 and ε 0.2 (0.45) 0.0139 /
0.0073 — selection is better at both, the rule selects at the first only; d = 50 pairs at ε 0.15
(0.64-0.70) 0.0078 / 0.0083 and ε 0.2 (0.53-0.56) 0.0061 / 0.0079, d = 100 pairs at ε 0.5
(0.78-0.84) 0.0048 / 0.0052 and ε 0.7 (0.59) 0.0035 / 0.0051 — "all" is better at all four, where
a half for pairs would select (AIM's criterion, which pairs keep, measures all there). The crossing lies near ``E_all / D^`` of 0.25 for these
triples and is not one number for these pairs (selection won at d = 50, ε 0.1, at 0.87-0.99, "all"
at d = 100, ε 0.5, at 0.78-0.84). So **the half applies only to workloads of triples or larger**
(every set of three attributes or more): on triples no run had "all" better at a ratio above 1/2,
while on pairs a half won at d = 50, ε 0.1 and lost all four runs between the budgets above; a
workload with pairs keeps AIM's criterion
(the lead's restriction of stream s27y's rule, at merge; pairs under pure ε take the half too since
*Rounds for pairs*, below, where selection runs ``2d`` rounds). Under pure ε and on
the many-valued domains "all" was never chosen, so nothing changed there. The figures of the
change are in the notes of issue 27 (``bench_wide_rule.py --accounting zcdp --eps 0.1``): d = 27
triples 0.0268 → 0.0095 / 0.0079 / 0.0094 (networks 3 / 4 / 5); d = 50 pairs would have gone
0.0102 / 0.0123 / 0.0123 → 0.0087 / 0.0079 / 0.0082 under a half for pairs too, which the runs
between the budgets above ruled out.

**Rounds for pairs** (issue 27, session 11). The one benchmark cell where a peer beat ``auto``:
binary d = 27, every pair (351), pure ε = 1, n = 50,000 (``bench_wide.py --cases bn``, network 1,
seed 7). ``auto`` measured "all" (``E_all / D^`` = 0.66, under AIM's criterion) and fitted it by
least squares: 0.0173 against factored MWEM's 0.0141. Each mode forced on the same cell and draws
(``bench_wide_modes.py``, mean L1/n): "all" 0.0173, selection (``T = d``) 0.0226, the one-way
fallback 0.0422; on the validation networks (3-5, seeds 1-4, networks averaged within a seed)
"all" 0.0171, selection 0.0146, one-way 0.0373, MWEM 0.0115: no mode beat MWEM, and the fit was
not the cause (a convex entropy-regularised fit of "all" tied least squares, session 10). What
MWEM does differently is measure about ``2d`` marginals (T = 54 at d = 27); these networks
(parents within three places) have more dependent pairs than ``d``, so ``d`` rounds leave real
dependence to the independence prior. Selection with more rounds, validation networks, same
seeds: ``T = 2d`` 0.0061 (0.0059 without the top-up, 0.0062 at ``T = 3d``, 0.0067 with
SELECT_SHARE 1/8); d = 50 at pure ε 1, 0.0084 against 0.0094 — but at pure ε 0.1 (d = 50) 0.0608
against 0.0514: more rounds lose when each round's noise is large against what is left to find.
So a workload of pairs (every set two attributes, ``T`` not given) runs ``PAIR_ROUNDS_FACTOR x d``
rounds (capped at the number of candidates) when the expected L1 noise of one of their
measurements, ``E_more`` (public, with the largest top-up for that many rounds:
``WideSelectionPlan.expected_noise_more_rounds``), is at most ``PAIR_ROUNDS_NOISE_FRACTION = 1/2``
of the probe's noisy deviation (:func:`more_rounds_pay`) and the exponential mechanism is not
blind at their smaller epsilon; else ``d``. ``E_more / D^`` was 0.21-0.28 where ``2d`` won (d = 27,
pure ε 1), 0.40-0.44 (d = 50, pure ε 1, seed 1) and 0.39-0.43 (d = 50, zCDP ε 0.1 where selection
ran: 0.0046 against 0.0084, network 3, seed 1), and 0.64-0.86 where it lost (d = 50, pure ε 0.1).
**The half and the factor 2 were chosen after seeing these runs** (networks 3-5), before the
benchmark network was run with them; they are judgements, not derived. With selection this strong,
"all" fitted by least squares no longer pays for pairs under pure ε at ``E_all / D^`` 0.65-0.86
(0.0171 against 0.0061), so pairs under pure ε take ALL_L2_NOISE_FRACTION as triples do
(:func:`all_noise_fraction`). Under zCDP pairs keep AIM's criterion: the runs between the budgets
(above) compared "all" with ``T = d``; against selection with this rule (``bench_wide_modes.py
--accounting zcdp --modes all select``, networks 3-5, seeds 1-2 or 1-4; select / "all" at
``E_all / D^``) the crossing is not one number: d = 27 selects better at ε 0.1 (0.28-0.36: 0.0050 /
0.0066), not at ε 0.2 (0.15-0.18: 0.0041 / 0.0034); d = 50 better at ε 0.1-0.2 (0.46-1.06: 0.0039-
0.0050 / 0.0061-0.0120), not at ε 0.5 (0.21-0.24: 0.0035 / 0.0024); d = 100 at ε 1 not (network 3,
0.40-0.42: 0.0030 / 0.0024). Open. Validation of the rule against the old one (``T = d``, fraction 1
for pairs), networks 3-5, seeds 1-4, paired per seed, s.e. over seeds
(``bench_wide_modes.py --d D --k 2 --accounting A --eps E --nets 3 4 5 --seeds 1 2 3 4 --modes auto``
with ``--plan '{}'`` and ``--plan '{"rounds": D, "all_fraction": 1}'``):

* d = 27, pure ε 1: 0.0171 → **0.0061** (−0.0110, s.e. 0.0004, 4 of 4 seeds; every run selects
  with 54 rounds), factored MWEM 0.0115 (the new rule lower in 12 of 12 runs);
* d = 50, pure ε 1: 0.0094 → 0.0086 (−0.0008, s.e. 0.0003; 3 of 4 seeds better, none worse; 9 of
  12 runs took ``2d``);
* d = 50, zCDP ε 0.1: 0.0116 → 0.0113 (one run of 12 selects, with ``2d``: 0.0084 → 0.0046);
* d = 27 and 50 at pure ε 0.1 and zCDP ε 1, d = 27 at zCDP ε 0.1: unchanged (no run took ``2d``
  or changed mode);
* d = 100 pairs: ``E_more / D^`` 0.54-1.0 at pure ε 0.1 and 1 and zCDP ε 0.1, and zCDP ε 1
  measures "all", so no run changes (the same draws); triples never take the option.

On the benchmark network (seed 7) only the cell above changes: 0.0173 → **0.0086** (MWEM 0.0141),
2.8 CPU-s; every other ``bench_wide.py`` cell keeps its mode and rounds (d = 50, pure ε 1:
``E_more / D^`` 0.56, ``T = d``).

**Can the fit of "all" finish?** A fit that is not certified releases nothing, after the whole
budget is spent. So the plan decides, before any draw and from public sizes only
(:func:`measure_all_fit`), whether the fit that ``mode = "all"`` would run can finish; if not, the
probe can choose only selection (its noisy deviation still sets the top-up), and the plan's text
(``dpopt check``) says why. The measured sets of "all" are every workload set and every attribute;
their fit is the estimator's with the release's options (``choose_objective`` under ``"auto"``):

* the smooth estimate on a junction tree of at most ``SMOOTH_TREE_CELLS`` cells: allowed (it
  certified in every run of issue 27, in seconds to minutes);
* least squares on the local relaxation (its cliques: the measured sets and the workload's):
  allowed by the one rule for least squares, :func:`least_squares_reach` — at most
  :data:`ALL_L2_CELLS` = 2^22 clique cells, and :data:`DECOMPOSABLE_L2_CELLS` = 2^22 when the sets
  are decomposable. Its docstring has the evidence (solve times, never an error figure: cyclic
  triples of adult certified at 4.06 M cells in 8-17 CPU-minutes; all of adult's triples, 20.9 M,
  certified in 2.6 CPU-hours, 125 minutes on 2 threads). The ``marginal_space`` algorithm's plan
  warning reads the same rule. "All" was held to
  2^20 (2^21 for decomposable sets) until session 18, when the solver's path for such sizes got
  faster; none of the validation grid's cases lies between the old and the new limits.

Beyond either limit only selection runs (T sets, each at most one workload set). Adult with every
3-way marginal is such a case: at the issue's budgets the probe chose selection anyway (expected
noise of "all" 926,248 per triple against a noisy deviation of 14,607 at zCDP ε 1), but a larger
budget would have chosen "all" and spent it on a fit that does not finish.

Privacy. Every step is charged to the accountant before its draw (the measurements through
:func:`~dpopt.privacy.mechanisms.measure`, the selections through
:func:`~dpopt.privacy.mechanisms.exponential_mechanism`, the probe here); the plan's shares are
exact fractions summing to the budget, so the ledger sums exactly to it. Under zCDP the
exponential mechanism at ``epsilon`` is charged ``epsilon^2 / 2`` (Bun and Steinke 2016, Prop. 1.4;
the bounded-range bound ``epsilon^2 / 8`` of Cesar and Rogers 2021 would be tighter), with
``epsilon`` the largest multiple of ``2^-30`` at or below ``sqrt(2 rho_select)`` (so the
measurement's share is what is left, exactly). Selection runs in marginal space: scores read
candidate marginals (at most a few thousand cells each), never the full table.

Validation, on networks other than the benchmark's (``random_sparse_network(d, seed=3, 4 or 5)``,
records seed + 100, measurement seeds 1-5; pure ε = 1, n = 50,000, mean L1/n; under load):

* the top-up against the former fixed one-way share of 1/10 (network 4, five seeds): d = 100
  pairs 0.0139 against 0.0173 (a top-up of 1/5: 0.0148); d = 50 pairs 0.0137 against 0.0154;
  d = 27 triples 0.0252 against 0.0244 (the unweighted top-up: 0.0259) — worse there, hence
  ``TOP_UP_NOISE_FRACTION``, with which triples take no top-up (network 3, five seeds: 0.0251
  either way) and pairs keep it (network 5, window 4, d = 50, three seeds: 0.0132 against 0.0159);
* ``T`` (network 3, two seeds, one-way share 0.46): ``T = d/2`` is worse everywhere
  (0.0165 / 0.0175 / 0.0368 at d = 100 / 50 pairs / 27 triples against 0.0121 / 0.0116 / 0.0265);
  ``T = 2d`` better at d = 50 (0.0097) but worse at d = 100 (0.0143) and d = 27 triples (0.0283);
  a ``T`` from the probe (rounds whose noise stays below its deviation) chose 95 and 108 rounds
  on pairs (0.0121, 0.0103) but 228 on triples (0.0666): not kept (those figures were least-squares fits; with
  the smooth fit, pairs take ``2d`` rounds where a round's noise is at most half the deviation:
  *Rounds for pairs*);
* annealing from ``T = d`` never fired on triples and lost on d = 100 pairs (0.0127 against
  0.0121): off by default;
* ``SELECT_SHARE``: 1/2 lost at d = 100 (0.0148 against 0.0123), 1/8 at d = 27 triples (0.0268
  against 0.0254) and won at d = 50 (0.0122 against 0.0129): 1/4 kept.

Benchmark figures (seed 7, network seed 1): ``examples/benchmarks/bench_wide.py`` and issue 27's
closing note.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from fractions import Fraction
from itertools import combinations

import numpy as np

from dpopt.errors import DomainError, ParameterError
from dpopt.privacy.accountant import PrivacyCost

__all__ = ["WideSelectionPlan", "WideSelection", "AllFit", "LeastSquaresReach", "plan_wide_selection",
           "run_wide_selection", "measure_all_fit", "fit_in_reach", "least_squares_reach", "model_noise",
           "one_way_weights", "selection_is_blind", "selection_scores", "selection_probabilities", "one_way_top_up",
           "measures_all", "all_noise_fraction", "expected_noise_all",
           "ONE_WAY_SHARE", "PROBE_SHARE", "SELECT_SHARE", "CANDIDATE_LIMIT", "ALL_L2_CELLS", "DECOMPOSABLE_L2_CELLS",
           "ALL_L2_NOISE_FRACTION", "PAIR_ROUNDS_FACTOR", "PAIR_ROUNDS_NOISE_FRACTION", "more_rounds_pay"]

#: Share of the budget for the mean-deviation probe that decides between measuring all and selecting.
PROBE_SHARE = Fraction(1, 100)
#: Share of the budget for the first one-way measurement (the probe's model; MST spends a third, AIM about a tenth).
ONE_WAY_SHARE = Fraction(1, 10)
#: Share of each selection round's part spent on the exponential mechanism (the rest measures).
SELECT_SHARE = Fraction(1, 4)
#: The most candidates the probe and selection read: beyond it, every pair and a uniform sample of the
#: larger sets (drawn independently of the data; d = 100 triples: 4,950 pairs and 15,050 of 161,700 triples).
CANDIDATE_LIMIT = 20_000
#: The second one-way measurement is taken only when the first model's expected noise explains at least
#: this share of the probe's deviation (module notes, step 3; chosen on the validation networks).
TOP_UP_NOISE_FRACTION = 0.5
#: The most clique cells (the local relaxation's: every maximal measured set's cells) of a least-squares
#: fit for which ``mode = "all"`` is allowed (:func:`least_squares_reach`: the evidence, solve times on
#: adult's slices, ``bench_admm_module.py --estimate``).
ALL_L2_CELLS = 2**22
#: The most clique cells of a least-squares fit over *decomposable* sets (:func:`least_squares_reach`):
#: adult's chain of 12 triples (1.54 M cells) certified in 88 CPU-s; no larger decomposable case was run,
#: and none has been harder than a cyclic family of its size, so it shares the cyclic limit.
DECOMPOSABLE_L2_CELLS = 2**22
#: When the fit of ``mode = "all"`` would be least squares (while selection's is the smooth estimate)
#: and every workload set has three attributes or more, "all" is measured only if its expected noise is
#: at most this share of the probe's noisy deviation (module notes, *Which fit each mode gets*: a
#: judgement between measured groups of runs, not derived).
ALL_L2_NOISE_FRACTION = Fraction(1, 2)
#: A workload of pairs selects ``PAIR_ROUNDS_FACTOR x d`` rounds instead of ``d`` when the expected L1 noise
#: of a round's measurement at that many rounds is at most ``PAIR_ROUNDS_NOISE_FRACTION`` of the probe's
#: noisy deviation (:func:`more_rounds_pay`; module notes, *Rounds for pairs*: a judgement on the validation
#: networks, not derived).
PAIR_ROUNDS_FACTOR = 2
PAIR_ROUNDS_NOISE_FRACTION = Fraction(1, 2)
#: Denominator of the rational epsilon used for a zCDP selection.
_EPS_DENOMINATOR = 2**30


@dataclass(frozen=True, eq=False)
class WideSelectionPlan:
    """The data-independent part of the plan (module notes): shares, candidates, rounds.

    Attributes
    ----------
    domain : Domain
    workload : tuple of tuple of str
        The workload's marginal sets (domain order).
    candidates : tuple of tuple of str
        What selection chooses from: the workload's sets of two or more attributes and their pairs.
    accounting : {"pure", "approx", "zcdp"}
    mechanism : {"laplace", "gaussian"}
    one_way, probe, rest : PrivacyCost
        Step 1's, step 2's and what is left for step 3 (the three sum exactly to the budget).
    rounds : int
        ``T`` for ``mode = "select"``: the most rounds (each ``(rest - top_up) / T``; annealing may
        double a round's share, so fewer rounds are run, module notes step 3).
    select_cost, measure_cost : PrivacyCost
        The first round's exponential mechanism and measurement with the largest top-up (``rounds``
        such rounds and ``top_up`` sum to ``rest``; a smaller top-up at run time leaves more per round).
    select_epsilon : Fraction
        The first round's exponential-mechanism epsilon.
    select_share : Fraction
        Each round's share for its exponential mechanism (``SELECT_SHARE``).
    anneal : bool
        Whether a round whose measurement barely moved the model doubles the next rounds' share (AIM).
    top_up : PrivacyCost
        ``mode = "select"`` only: a second measurement of the one-way marginals, taken from ``rest``
        before the rounds (:func:`one_way_top_up`).
    """

    domain: object
    workload: tuple
    candidates: tuple
    accounting: str
    mechanism: str
    one_way: PrivacyCost
    probe: PrivacyCost
    rest: PrivacyCost
    rounds: int
    select_cost: PrivacyCost
    measure_cost: PrivacyCost
    select_epsilon: Fraction = field(default=Fraction(0))
    select_share: Fraction = field(default=Fraction(1, 4))
    anneal: bool = False
    top_up: PrivacyCost | None = None
    top_up_rule: bool = False
    all_fit: "AllFit | None" = None
    #: The fit's options (keywords of :func:`fit_in_reach`): each pick is measured only if the fit of the
    #: measured sets stays in reach (module notes, step 3).
    fit: dict = field(default_factory=dict)
    #: Whether the one-way fallback of step 3 is open: the top-up rule (:func:`one_way_top_up`, at
    #: ``phi = 1``) finds that no second one-way measurement pays for selection.
    one_way_fallback: bool = False
    #: ``E_all``: the expected L1 noise of a workload marginal measured by ``mode = "all"``
    #: (:func:`expected_noise_all`, public), and the share of the probe's deviation it may reach for
    #: "all" to be measured (:func:`all_noise_fraction`: 1, or ``ALL_L2_NOISE_FRACTION`` when the fit
    #: of "all" would be least squares; module notes, *Which fit each mode gets*).
    expected_noise_all: float = 0.0
    all_fraction: Fraction = Fraction(1)
    #: Pairs only (module notes, *Rounds for pairs*): the rounds ``more_rounds`` (0: no such option) run
    #: instead of ``rounds`` when the expected L1 noise of one of their measurements (public, with the
    #: largest top-up), ``expected_noise_more_rounds``, is at most PAIR_ROUNDS_NOISE_FRACTION of the
    #: probe's noisy deviation (:func:`more_rounds_pay`).
    more_rounds: int = 0
    expected_noise_more_rounds: float = 0.0
    #: The exponential mechanism's epsilon in one of those rounds (the same largest top-up): the run
    #: keeps ``rounds`` when it is blind there (:func:`selection_is_blind`).
    epsilon_more_rounds: object = 0

    def steps(self) -> list:
        """The plan's privacy-spending steps (:class:`~dpopt.algorithms.base.PlannedMeasure`), shares exact:
        the one-way marginals, the probe, then either every workload marginal or the rounds (the
        probe decides, so the last step's query is chosen during the run)."""
        from dpopt.algorithms.base import PlannedMeasure

        total = self.one_way.epsilon + self.probe.epsilon + self.rest.epsilon if self.accounting != "zcdp" \
            else self.one_way.rho + self.probe.rho + self.rest.rho
        part = (lambda c: c.rho / total) if self.accounting == "zcdp" else (lambda c: c.epsilon / total)  # noqa: E731
        law = _law_of_share(self.domain, [(a,) for a in self.domain.attrs], self.one_way, self.mechanism)
        ones = _stack(self.domain, [(a,) for a in self.domain.attrs])
        return [PlannedMeasure("one-way marginals", ones, self.mechanism, part(self.one_way), self.one_way, law,
                               what=f"{len(self.domain.attrs)} one-way marginals", answers=ones.num_rows),
                PlannedMeasure("wide selection: deviation probe", None, self.mechanism, part(self.probe), self.probe,
                               what="mean L1 deviation of the candidates from the one-way model (sensitivity 1)",
                               answers=1),
                PlannedMeasure("workload marginals or selected rounds", None, self.mechanism, part(self.rest),
                               self.rest, what=f"every workload marginal ({len(self.workload)}), or "
                               + ("a second one-way measurement and " if self.top_up is not None else "")
                               + f"{self.rounds} exponential-mechanism choices and their measurements"
                               + (f" ({self.more_rounds} when the probe says they pay)" if self.more_rounds else ""))]

    def lines(self) -> list[str]:
        f = _amount
        allowed = [] if self.all_fit is None else [self.all_fit.line()]
        share, why = ("", "") if self.all_fraction == 1 else \
            (f"{self.all_fraction} of ", " (ALL_L2_NOISE_FRACTION: the fit of \"all\" would be least squares)")
        every = ("" if self.all_fit is not None and not self.all_fit.fits else
                 f"every workload marginal ({len(self.workload)}, {f(self.rest)} in all) if its expected noise "
                 f"({self.expected_noise_all:,.4g} per marginal) is at most {share}that deviation{why}, else ")
        return [f"what to measure (dpopt.strategy.wide_selection, after MST and AIM): the one-way marginals "
                f"({f(self.one_way)}) and a probe of their model's mean deviation ({f(self.probe)}); then {every}"
                + (f"a second one-way measurement (at most {f(self.top_up)}) and " if self.top_up is not None else "")
                + f"{self.rounds} rounds"
                + (f" (or {self.more_rounds}, each {Fraction(self.rounds, self.more_rounds)} as large, if the "
                   f"expected noise of their measurements, {self.expected_noise_more_rounds:,.4g} per marginal, is "
                   f"at most {PAIR_ROUNDS_NOISE_FRACTION} of that deviation: PAIR_ROUNDS_NOISE_FRACTION)"
                   if self.more_rounds else "")
                + ", each an exponential-mechanism choice among "
                f"{len(self.candidates)} candidates ({f(self.select_cost)}) and its measurement "
                f"({f(self.measure_cost)}), a pick measured only if the fit of the measured sets stays in reach "
                f"(else its measurement's share goes to the rounds to come)"
                + "; or the one-way marginals again with the rest (" + f(self.rest) + ") when selection cannot pay "
                "for its noise: " + ("the one-way model's expected noise is at least the probe's deviation (no second "
                                     "one-way measurement pays for selection here), or " if self.one_way_fallback
                                     else "") + "the exponential mechanism's utility bound exceeds any deviation",
                *allowed]


def plan_wide_selection(domain, workload, budget, mechanism: str, *, rounds: int | None = None,
                        top_up: Fraction | None = None, select_share: Fraction = SELECT_SHARE,
                        anneal: bool = False, fit: dict | None = None,
                        all_fraction: Fraction | None = None) -> WideSelectionPlan:
    """The plan of the module notes, before any data.

    Parameters
    ----------
    domain : Domain
    workload : iterable of attribute sequences
        The marginals to answer.
    budget : Budget
        The whole budget of the release.
    mechanism : {"laplace", "gaussian"}
    rounds : int, optional
        ``T``, the most selection rounds (default: the number of attributes, ``d``).
    top_up : Fraction, optional
        The share of the whole budget for the second one-way measurement of ``mode = "select"``
        (default: :func:`one_way_top_up`'s rule; 0 for none).
    select_share : Fraction
        Each round's share for its exponential mechanism (default ``SELECT_SHARE``).
    anneal : bool
        AIM's budget annealing (module notes, step 3); ``False`` runs exactly ``rounds`` equal rounds.
    fit : dict, optional
        The fit's options, keywords of :func:`measure_all_fit` (``constraints``, ``objective``,
        ``total``, ``shrink``, ``nonnegative``; default: the estimator's defaults): whether the fit
        of ``mode = "all"`` can finish is decided here, from public sizes only (module notes).
    all_fraction : Fraction, optional
        The share of the probe's deviation that ``E_all`` may reach for ``mode = "all"`` (default:
        :func:`all_noise_fraction`'s rule from the fit of "all"; 1 is AIM's criterion alone, the
        rule before the fit each mode gets was taken into account: benchmarks).
    """
    sets = tuple(dict.fromkeys(tuple(domain.canonical(s)) for s in workload))
    if not sets:
        raise ParameterError("workload: no marginals to answer")
    d = len(domain.attrs)
    default_rounds = rounds is None
    rounds = d if rounds is None else int(rounds)
    if rounds < 1:
        raise ParameterError(f"rounds must be >= 1, got {rounds}")
    pairs = {p for s in sets if len(s) >= 2 for p in combinations(s, 2)}
    candidates = tuple(sorted({s for s in sets if len(s) >= 2} | pairs,
                              key=lambda s: (len(s), tuple(domain.attrs.index(a) for a in s))))
    select_share = Fraction(select_share)
    if not 0 < select_share < 1:
        raise ParameterError(f"select_share must lie in (0, 1), got {select_share}")
    accounting = budget.accounting
    left = 1 - ONE_WAY_SHARE - PROBE_SHARE
    rule = top_up is None  # the plan's top-up is the most; the run scales it by the probe (one_way_top_up)
    top_up = one_way_top_up(domain, candidates, rounds, accounting, select_share) if rule else Fraction(top_up)
    if not 0 <= top_up < left:
        raise ParameterError(f"top_up must lie in [0, {left}), got {top_up}")
    one_way, probe, rest = budget.share(ONE_WAY_SHARE), budget.share(PROBE_SHARE), budget.share(left)
    rounds_part = _scale(rest, (left - top_up) / left)
    select_cost, measure_cost, eps = _round_costs(_scale(rounds_part, Fraction(1, rounds)), accounting, select_share)
    fit = dict(fit or {})
    # The selection's fit holds the workload's sets whatever is chosen: when it is least squares for
    # any choice (the one-way marginals alone already give least squares), it must be in reach here.
    fewest = fit_in_reach(domain, [(a,) for a in domain.attrs], sets, **fit, what="on the one-way marginals")
    if not fewest.fits:
        raise DomainError(f"no selection's fit can finish: {fewest.reason}; name fewer or smaller "
                          "marginals" + (", or use estimator 'auto'" if fit.get("objective", "auto") != "auto" else ""))
    all_fit = measure_all_fit(domain, sets, **fit)
    # Pairs only, at the default T: the rounds the probe may double (module notes, *Rounds for pairs*),
    # never more than there are candidates (each round measures a new one, so the ledger still sums).
    more = min(PAIR_ROUNDS_FACTOR * d, len(candidates)) if default_rounds and all(len(c) == 2 for c in sets) else 0
    noise_more, eps_more = 0.0, 0
    if more > rounds:
        from dpopt.model.queries.marginal import Marginal
        from dpopt.privacy.mechanisms import calibrate

        # Its first round's measurement with the largest top-up for that many rounds (as for `measure_cost`).
        top_more = one_way_top_up(domain, candidates, more, accounting, select_share) if rule else top_up
        _, measure_more, eps_more = _round_costs(_scale(rest, (left - top_more) / left / more), accounting,
                                                 select_share)
        cells = np.array([domain.project(list(c)).size for c in candidates], dtype=np.float64)
        noise_more = float(np.mean(cells)) * _mean_abs(calibrate(Marginal(domain, candidates[0]), measure_more,
                                                                 mechanism))  # any marginal: sensitivity 1
    else:
        more = 0
    return WideSelectionPlan(domain, sets, candidates, accounting, mechanism, one_way, probe, rest, rounds,
                             select_cost, measure_cost, eps, select_share, bool(anneal),
                             _scale(rest, top_up / left) if top_up else None, rule, all_fit, fit, rule and not top_up,
                             expected_noise_all(domain, sets, rest, mechanism),
                             all_noise_fraction(all_fit, fit.get("objective", "auto"), min(len(c) for c in sets),
                                                accounting)
                             if all_fraction is None
                             else Fraction(all_fraction), more, noise_more, eps_more)


def expected_noise_all(domain, workload, rest: PrivacyCost, mechanism: str) -> float:
    """``E_all`` (module notes, step 2): the expected L1 noise of one workload marginal when every
    workload marginal is measured in one stack with the cost ``rest``, averaged over the workload:
    ``mean_C |C cells| x E|z|``, with ``E|z| = b`` (Laplace, scale ``b = Delta_1 / epsilon``) or
    ``sqrt(2/pi) sigma`` (Gaussian, ``sigma^2 = Delta_2^2 / (2 rho)``; continuous approximations of the
    discrete laws). The stack's sensitivities are the workload's: ``Delta_1 = Delta_2^2 = M`` for ``M``
    marginals. Public: sizes and the budget only."""
    from dpopt.privacy.mechanisms import calibrate

    law = calibrate(_stack(domain, workload), rest, mechanism)
    cells = np.array([domain.project(list(s)).size for s in workload], dtype=np.float64)
    return float(np.mean(cells) * _mean_abs(law))


def all_noise_fraction(all_fit: "AllFit | None", objective: str = "auto", order: int = 3,
                       accounting: str = "zcdp") -> Fraction:
    """The share of the probe's noisy deviation that ``E_all`` may reach for ``mode = "all"`` to be
    measured (:func:`measures_all`; module notes, *Which fit each mode gets*):
    :data:`ALL_L2_NOISE_FRACTION` when the fit of "all" would be least squares while selection's
    may be the smooth estimate (``objective`` not ``"l2"``) and either the workload's smallest set
    has ``order >= 3`` attributes or the accounting is pure (or approximate) ε, whose pairs select
    with more rounds (module notes, *Rounds for pairs*); else 1 (AIM's criterion: both modes get
    the same kind of fit — "all" fitted smooth, or least squares forced for both —, or a workload
    with pairs under zCDP, where the measured runs did not support the half). Public:
    :func:`measure_all_fit` reads sizes and options only."""
    if all_fit is None or all_fit.objective == "smooth" or objective == "l2" or (order < 3 and accounting == "zcdp"):
        return Fraction(1)
    return Fraction(ALL_L2_NOISE_FRACTION)


def more_rounds_pay(expected_noise_more: float, deviation: float) -> bool:
    """Whether a workload of pairs selects ``WideSelectionPlan.more_rounds`` rounds (module notes,
    *Rounds for pairs*): when the expected L1 noise of one of their measurements (public) is at most
    :data:`PAIR_ROUNDS_NOISE_FRACTION` of the probe's noisy deviation ``D^``, the candidates deviate
    from the model by well above what measuring costs, so twice the measured sets pay for the noise
    each adds. Reads a public number and a noisy release only."""
    return float(expected_noise_more) <= float(PAIR_ROUNDS_NOISE_FRACTION) * float(deviation)


def measures_all(expected_all: float, deviation: float, fraction) -> bool:
    """The probe's decision (module notes, step 2): measure every workload marginal when
    ``E_all <= fraction x D^`` (``fraction``: :func:`all_noise_fraction`), else select."""
    return float(expected_all) <= float(fraction) * float(deviation)


@dataclass(frozen=True)
class AllFit:
    """Whether the fit of ``mode = "all"`` (every workload marginal and the one-way marginals
    measured) is one the estimator can finish (module notes, *Can the fit of "all" finish?*).

    Attributes
    ----------
    fits : bool
    objective : {"smooth", "l2"}
        The fit ``estimate_marginals`` would run on those measurements.
    cells : int
        Its size: the junction tree's cells (smooth) or the local relaxation's clique cells (l2).
    limit : int
        The size it is held to: ``SMOOTH_TREE_CELLS`` or :data:`ALL_L2_CELLS`.
    reason : str
    """

    fits: bool
    objective: str
    cells: int
    limit: int
    reason: str

    def line(self) -> str:
        return ("measuring every workload marginal is allowed: " if self.fits else
                "measuring every workload marginal is excluded (the probe can only choose selection): ") + self.reason

    def info(self) -> dict:
        return {"fits": self.fits, "objective": self.objective, "cells": self.cells, "limit": self.limit,
                "reason": self.reason}


def measure_all_fit(domain, sets, constraints=None, *, objective: str = "auto", total="auto", shrink: bool = False,
                    nonnegative: bool = True) -> AllFit:
    """Can the fit of ``mode = "all"`` finish? Public sizes only, before any draw (module notes).

    The measured sets of ``mode = "all"`` are every workload set and every attribute. The fit is
    that of :func:`~dpopt.estimate.marginal_space.estimate_marginals` with these options: under
    ``objective = "auto"`` the rule of
    :func:`~dpopt.estimate.marginal_space.estimator.choose_objective`. The smooth estimate on a
    junction tree of at most ``SMOOTH_TREE_CELLS`` cells (its own limit, which
    ``choose_objective`` applies) certified in every run (issue 27); least squares — residual
    least squares then the certified projection over the local relaxation — is allowed up to
    :data:`ALL_L2_CELLS` clique cells (the evidence is in the module notes). Beyond either,
    ``"select"`` is the plan.

    Parameters
    ----------
    domain : Domain
    sets : sequence of attribute-name tuples
        The workload's marginal sets.
    constraints : ConstraintSet, optional
    objective : {"auto", "l2", "smooth"}
    total, shrink, nonnegative
        As for :func:`~dpopt.estimate.marginal_space.estimate_marginals`.

    Returns
    -------
    AllFit
    """
    measured = [tuple(s) for s in sets] + [(a,) for a in domain.attrs]
    return fit_in_reach(domain, measured, sets, constraints, objective=objective, total=total, shrink=shrink,
                        nonnegative=nonnegative, what="on every workload set")


def fit_in_reach(domain, measured, workload, constraints=None, *, objective: str = "auto", total="auto",
                 shrink: bool = False, nonnegative: bool = True, what: str = "") -> AllFit:
    """Can the fit of these measured sets, answering ``workload``, finish? Public sizes only.

    The fit is :func:`~dpopt.estimate.marginal_space.estimate_marginals`'s with these options: under
    ``objective = "auto"`` the rule of
    :func:`~dpopt.estimate.marginal_space.estimator.choose_objective` (the smooth estimate on a
    junction tree of at most ``SMOOTH_TREE_CELLS`` cells, its own limit: it certified in every run of
    issue 27), else least squares, held to :func:`least_squares_reach` (the one rule for least
    squares, with its evidence) over its cliques: the measured sets and the workload's. Used for
    ``mode = "all"`` (:func:`measure_all_fit`) and for each pick of the selection (module notes,
    step 3), before the pick is measured.
    """
    from dpopt.estimate.marginal_space.estimator import SMOOTH_TREE_CELLS, choose_objective

    measured, workload = [tuple(s) for s in measured], [tuple(s) for s in workload]
    if objective != "l2":
        choice = choose_objective(domain, measured, workload, constraints, total=total, shrink=shrink,
                                  nonnegative=nonnegative, exact_cells=0)
        if choice.objective == "smooth":
            return AllFit(True, "smooth", int(choice.tree_cells), SMOOTH_TREE_CELLS, choice.reason)
        if objective == "smooth":
            return AllFit(False, "smooth", int(choice.tree_cells or 0), SMOOTH_TREE_CELLS,
                          f"objective 'smooth'{' ' + what if what else ''}: {choice.reason}")
        why = choice.reason
    else:
        why = "least squares: objective 'l2'"
    reach = least_squares_reach(domain, measured + workload)
    return AllFit(reach.fits, "l2", reach.cells, reach.limit, f"{why}; {reach.reason}")


@dataclass(frozen=True)
class LeastSquaresReach:
    """:func:`least_squares_reach`'s answer: whether the fit is in reach, its clique cells, the limit
    that applies (:data:`ALL_L2_CELLS` or :data:`DECOMPOSABLE_L2_CELLS`), whether the sets are
    decomposable, and a one-line reason naming the limit."""

    fits: bool
    cells: int
    limit: int
    decomposable: bool
    reason: str


def least_squares_reach(domain, sets) -> LeastSquaresReach:
    """Can a certified least-squares fit over these measured sets finish? Public sizes only.

    The one rule for every least-squares fit in marginal space (``auto``'s wide plan for
    ``mode = "all"`` and for its selection, :func:`measure_all_fit`; the ``marginal_space``
    algorithm's plan warning, :func:`dpopt.algorithms.marginal_space.least_squares_size_warning`).
    The fit is residual least squares, then the certified projection over the local relaxation
    whose cliques are the maximal sets (:func:`~dpopt.estimate.marginal_space.layout.clique_cells`).
    It is in reach when that relaxation holds

    * at most :data:`ALL_L2_CELLS` = 2^22 clique cells, or
    * at most :data:`DECOMPOSABLE_L2_CELLS` = 2^22 clique cells and the maximal sets are
      decomposable (the cliques of a chordal graph: the local polytope is then the marginal
      polytope, Wainwright and Jordan 2008, §4.1).

    Evidence (solve times, never error; least squares on every triple of adult slices, zCDP ε 1,
    seed 7, ``estimate_marginals`` end to end, CPU seconds with another process on the machine;
    issue 27, session 18, ``bench_admm_module.py --attrs … --estimate``): cyclic families certified
    at 554 k cells (8 attributes, 56 triples) in 28 CPU-s, 929 k in 41, 1.77 M in 141, 2.34 M
    (9 attributes, 84 triples) in 245 and 4.06 M (10 attributes, 120 triples: the stand-in's 9 and
    native-country) in 468 (1,931 products, peak 2.7 GB; at zCDP ε 0.1 in 1,019, 4,098 products);
    every triple of adult (364, 20.9 M cells) in 2.6 CPU-hours (docs, *marginal space* §2). Adult's
    decomposable chain (12 triples, 1.54 M cells) certified in 88 CPU-s (``bench_wide.py --cases
    adult-chain --estimators ls``). The limit is a judgement just above the largest cyclic case
    certified in minutes, not a derived constant; decomposable
    families have never been harder than cyclic ones of their size, and share it. Until session 18
    the limits were 2^20 and 2^21: the fits between 1 M and 2 M cells went to L-BFGS-B, which
    did not certify 1.77 M within 619 CPU-s (``projection.NEWTON_CELLS`` now sends them to
    projected-Newton rounds and ADMM). None of the validation grid's cases (generated networks of
    at most 23,400 clique cells; the grouped one, 9.2 M; adult's every triple, 20.9 M) lies between
    the old limits and 2^22, so their plans are unchanged.

    Parameters
    ----------
    domain : Domain
    sets : iterable of attribute-name sequences
        The measured sets (and any workload set the fit must hold).

    Returns
    -------
    LeastSquaresReach
    """
    from dpopt.estimate.marginal_space.layout import clique_cells, is_decomposable, maximal_sets

    sets = [tuple(s) for s in sets if s]
    cells = clique_cells(domain, sets)
    decomposable = is_decomposable(maximal_sets([tuple(sorted(domain.axes(s))) for s in sets]))
    limit = DECOMPOSABLE_L2_CELLS if decomposable else ALL_L2_CELLS
    name = "DECOMPOSABLE_L2_CELLS" if decomposable else "ALL_L2_CELLS"
    kind = "decomposable" if decomposable else "cyclic"
    if cells <= limit:
        return LeastSquaresReach(True, cells, limit, decomposable,
                                 f"its local relaxation holds {cells:,} clique cells of {kind} sets, at most "
                                 f"{name} = {limit:,}")
    return LeastSquaresReach(False, cells, limit, decomposable,
                             f"its local relaxation would hold {cells:,} clique cells of {kind} sets, above {name} = "
                             f"{limit:,}, beyond which a certified least-squares fit is not known to finish")


def one_way_top_up(domain, candidates, rounds: int, accounting: str, select_share: Fraction = SELECT_SHARE,
                   noise_fraction: float = 1.0) -> Fraction:
    """The share ``x`` of the budget for the second one-way measurement of ``mode = "select"``.

    It minimises the expected L1 noise a candidate sees. A candidate ``C`` (attributes ``a`` with
    ``c_a`` cells, ``|C|`` cells in all) is judged against the product of the one-way marginals;
    to first order the product's L1 error is the sum of the one-way marginals' L1 errors,
    ``sum_a c_a E|z_1|``, where ``z_1`` is the noise of one one-way cell (the stack of ``d``
    one-way marginals has L1 sensitivity ``d`` and squared L2 sensitivity ``d``). If ``C`` is
    chosen it is measured with noise ``z_m`` per cell (L1 sensitivity 1, a share ``(1 -
    select_share)(r - s - x) / T`` of the budget, ``s = ONE_WAY_SHARE`` the first one-way
    measurement's share, ``r = 1 - PROBE_SHARE``). The two one-way measurements are combined by
    inverse variance. The expected error of the model's one-way part plus the measured marginal's
    noise, in units of ``1 / epsilon`` (resp. ``1 / sqrt(rho)``), is

    * pure ε (Laplace, ``E|z| = b = Delta_1 / epsilon``; inverse-variance combination of scales
      ``d / (s epsilon)`` and ``d / (x epsilon)`` has variance ``2 d^2 / ((s^2 + x^2) epsilon^2)``)::

          f(x) = A / sqrt(s^2 + x^2) + B / (r - s - x),   A = d sum_a c_a,   B = |C| T / (1 - select_share)

    * zCDP (Gaussian, ``E|z| = sqrt(2/pi) sigma``, ``sigma^2 = Delta_2^2 / (2 rho)``; the two
      measurements combine to one of ``rho`` share ``s + x``; the selection's part of a round's
      ``rho`` taken as ``select_share``)::

          f(x) = a / sqrt(s + x) + b / sqrt(r - s - x),   a^2 = d (sum_a c_a)^2,   b^2 = |C|^2 T / (1 - select_share)

    with ``A``, ``B`` (``a``, ``b``) averaged over the candidates. The budget cancels: ``x``
    depends on ``d``, the candidates, ``T`` and ``select_share`` only (public quantities). ``x`` is
    the grid minimiser over multiples of 1/1000 in ``[0, r - s)`` (an exact fraction the ledger can
    sum). Approximate DP uses the pure rule. ``noise_fraction`` (``phi`` in [0, 1]) weighs the
    one-way term: the run passes the share of the probe's noisy deviation that the first model's
    expected noise explains (module notes, step 3). At ``phi = 1``, binary pairs at ``T = d``
    (d = 100) give ``x = 0.403`` (pure ε: one-way noise as from one measurement of share
    ``sqrt(0.1^2 + 0.403^2) = 0.415``) and ``x = 0.371`` (zCDP); binary triples (d = 27) 0.372
    and 0.327.

    Why two measurements: the probe (step 2) decides between measuring every workload marginal and
    selecting; only selection needs an accurate one-way model, and a share as large as this one
    would cost the measure-all path (under zCDP the usual one) a third of its noise.
    """
    d = len(domain.attrs)
    if not candidates:
        return Fraction(0)
    one_cells = float(np.mean([sum(domain.project([a]).size for a in c) for c in candidates]))
    cells = float(np.mean([domain.project(list(c)).size for c in candidates]))
    s, r, phi = float(ONE_WAY_SHARE), float(1 - PROBE_SHARE), min(max(float(noise_fraction), 0.0), 1.0)
    spread = rounds / float(1 - Fraction(select_share))
    x = np.arange(0, round((r - s) * 1000)) / 1000.0
    if accounting == "zcdp":
        f = phi * math.sqrt(d) * one_cells / np.sqrt(s + x) + cells * math.sqrt(spread) / np.sqrt(r - s - x)
    else:
        f = phi * d * one_cells / np.sqrt(s * s + x * x) + cells * spread / (r - s - x)
    return Fraction(int(np.argmin(f)), 1000)


def _round_costs(per_round: PrivacyCost, accounting: str, select_share: Fraction) -> tuple:
    """One round's exponential-mechanism cost, its measurement's cost, and the mechanism's epsilon
    (the two costs sum exactly to ``per_round``)."""
    if accounting == "zcdp":
        rho_select = per_round.rho * select_share
        # A dyadic epsilon (small denominator: the exact sampler's arithmetic stays in int64).
        numerator = math.isqrt(math.floor(2 * rho_select * _EPS_DENOMINATOR ** 2))
        eps = Fraction(numerator, _EPS_DENOMINATOR)  # eps^2 / 2 <= rho_select: the charge stays within the share
        return PrivacyCost.pure(eps), PrivacyCost.zcdp(per_round.rho - eps * eps / 2), eps
    eps = per_round.epsilon * select_share
    measure_cost = _scale(per_round, 1 - select_share) if accounting == "pure" else \
        PrivacyCost.approx(per_round.epsilon - eps, per_round.delta)
    return PrivacyCost.pure(eps), measure_cost, eps


def _amount(cost: PrivacyCost) -> str:
    """``epsilon = 1/10``, ``rho = 1/20`` or both with delta: for the plan's lines (a round's long
    share to 4 digits: :func:`~dpopt.privacy.conversions.readable_amount`)."""
    from dpopt.privacy.conversions import readable_amount as short

    parts = [f"rho = {short(cost.rho)}"] if cost.rho is not None and not cost.epsilon else []
    if cost.epsilon:
        parts.append(f"epsilon = {short(cost.epsilon)}" + (f", delta = {short(cost.delta)}" if cost.delta else ""))
    return ", ".join(parts)


def _scale(cost: PrivacyCost, f: Fraction) -> PrivacyCost:
    return PrivacyCost(epsilon=cost.epsilon * f, delta=cost.delta * f, rho=None if cost.rho is None else cost.rho * f)


# ---- selection model ---------------------------------------------------------------------------------
class _Model:
    """Noisy marginals measured so far, normalised (internal to selection; never released)."""

    def __init__(self, domain, one_way: dict, total: float) -> None:
        self.domain = domain
        self.total = max(float(total), 1.0)
        self.tables: dict[tuple, np.ndarray] = {}
        self.measured: set[tuple] = set()
        for attrs, values in one_way.items():
            self.tables[tuple(attrs)] = _normalised(values, domain.project(list(attrs)).sizes)

    def add(self, attrs: tuple, values: np.ndarray) -> None:
        """A measured marginal, and its projections on every subset of two or more attributes not
        measured itself (so a candidate meeting it in a pair sees that pair)."""
        law = _normalised(values, self.domain.project(list(attrs)).sizes)
        self.tables[attrs] = law
        self.measured.add(attrs)
        for k in range(2, len(attrs)):
            for sub in combinations(range(len(attrs)), k):
                key = tuple(attrs[i] for i in sub)
                if key not in self.measured:
                    drop = tuple(i for i in range(len(attrs)) if i not in sub)
                    self.tables[key] = law.sum(axis=drop)

    def counts(self, attrs: tuple) -> np.ndarray:
        """``n^ x`` the model's law of ``attrs`` (flat, domain order): module notes, step 3."""
        return self.total * self._law(attrs).ravel()

    def _law(self, attrs: tuple) -> np.ndarray:
        attrs = tuple(attrs)
        if attrs in self.tables:
            return self.tables[attrs]
        # A measured set inside attrs, largest first; then what it leaves.
        inside = [s for s in self.tables if len(s) >= 2 and set(s) < set(attrs)]
        if not inside:
            return _outer([self.tables[(a,)] for a in attrs], [(a,) for a in attrs], attrs)
        inside.sort(key=lambda s: -len(s))
        first = inside[0]
        left = tuple(a for a in attrs if a not in first)
        # A second measured set joining one attribute of `first` to the attributes left (a chain).
        for s in inside[1:]:
            common = [a for a in s if a in first]
            if len(common) == 1 and set(s) - set(first) == set(left):
                joint = _outer([self.tables[first], self.tables[s]], [first, s], attrs, shared=common[0],
                               shared_law=self.tables[(common[0],)])
                return joint
        return _outer([self.tables[first]] + [self.tables[(a,)] for a in left], [first] + [(a,) for a in left],
                      attrs)


def _normalised(values, shape) -> np.ndarray:
    p = np.maximum(np.asarray(values, dtype=np.float64), 0.0)
    s = p.sum()
    p = p / s if s > 0 else np.full(p.size, 1.0 / p.size)
    return p.reshape(tuple(int(x) for x in shape))


def _outer(tables, owners, attrs, shared=None, shared_law=None) -> np.ndarray:
    """The product of laws over attribute groups, on ``attrs`` in order; with ``shared``, the two
    tables share that attribute and the product is divided by its law (a chain)."""
    letters = {a: chr(97 + i) for i, a in enumerate(attrs)}
    operands, subscripts = [], []
    for t, o in zip(tables, owners):
        operands.append(t)
        subscripts.append("".join(letters[a] for a in o))
    if shared is not None:
        law = np.asarray(shared_law, dtype=np.float64)
        operands.append(np.divide(1.0, law, out=np.zeros_like(law), where=law > 0))
        subscripts.append(letters[shared])
    out = "".join(letters[a] for a in attrs)
    return np.einsum(",".join(subscripts) + "->" + out, *operands)


def selection_scores(true: list, model: list, penalty: np.ndarray) -> np.ndarray:
    """AIM's scores (module notes, step 3): ``||M_C(x) - m_C||_1 - penalty_C`` per candidate.

    L1 sensitivity 1 in the data (add or remove one record) when ``model`` and ``penalty`` were
    computed from noisy answers and public values only, as :func:`run_wide_selection` does. The
    exponential mechanism then picks ``C`` with probability
    ``exp(epsilon q_C / 2) / sum_C' exp(epsilon q_C' / 2)`` (:func:`selection_probabilities`).
    """
    return np.array([np.abs(t - m).sum() for t, m in zip(true, model)]) - np.asarray(penalty, dtype=np.float64)


def selection_probabilities(scores, epsilon) -> np.ndarray:
    """The exponential mechanism's law over candidates of ``scores`` (sensitivity 1), in closed form."""
    q = np.asarray(scores, dtype=np.float64)
    w = np.exp(float(epsilon) * (q - q.max()) / 2)
    return w / w.sum()


# ---- run -------------------------------------------------------------------------------------------
@dataclass
class WideSelection:
    """What :func:`run_wide_selection` measured and why."""

    measurements: list
    mode: str
    deviation: float
    expected_noise_all: float
    chosen: list
    total: float
    all_fit: AllFit | None = None
    #: ``mode = "select"``: the share of the whole budget the second one-way measurement took, and the
    #: share ``phi`` of the probe's deviation the first model's expected noise explains (step 3).
    top_up: Fraction = Fraction(0)
    phi: float | None = None
    #: The first model's expected noise over the probe's noisy deviation (:func:`model_noise`; step 3).
    steer: float | None = None
    #: Picks not measured because the fit would have been out of reach: ``(set, reason, k)``, ``k`` the
    #: number of sets chosen before it (step 3).
    refused: list = field(default_factory=list)
    #: ``mode = "one-way"``: whether the exponential mechanism was blind (:func:`selection_is_blind`).
    blind: bool = False
    #: The share of the deviation ``E_all`` could reach for "all" (:func:`all_noise_fraction`).
    all_fraction: Fraction = Fraction(1)
    #: ``mode = "select"``: the rounds planned, ``T`` or, for pairs, the probe's ``more_rounds``.
    rounds: int = 0

    def info(self) -> dict:
        """For ``release.info``: the decision and its evidence (noisy, hence releasable), the chosen sets."""
        return {"mode": self.mode, "deviation": self.deviation, "expected_noise_all": self.expected_noise_all,
                "chosen": [list(c) for c in self.chosen], "top_up": str(self.top_up), "phi": self.phi,
                "steer": self.steer, "blind": self.blind, "all_fraction": str(self.all_fraction),
                "rounds": self.rounds, "refused": [[list(c), why] for c, why, _ in self.refused],
                "all_fit": None if self.all_fit is None else self.all_fit.info()}

    def describe(self) -> str:
        if self.mode == "one-way":
            why = ("the exponential mechanism's utility bound exceeds any deviation" if self.blind else
                   f"the one-way model's expected noise is {self.steer:.3g} times the probe's noisy deviation, and "
                   "measuring a candidate costs more than a better one-way model would save")
            return (f"the one-way marginals measured again with the rest of the budget, each attribute's alone with a "
                    f"share proportional to sqrt(sets holding it x its values): selection could not pay for its noise "
                    f"({why})")
        refused = (f"; {len(self.refused)} pick(s) not measured, the fit would have been out of reach "
                   f"({self.refused[0][1]})" if self.refused else "")
        share = "" if self.all_fraction == 1 else f"{self.all_fraction} of "
        why = "" if self.all_fraction == 1 else ", the most for \"all\" fitted by least squares"
        if self.mode == "all":
            return (f"every workload marginal measured (expected L1 noise {self.expected_noise_all:.3g} per marginal, "
                    f"at most {share}the one-way model's noisy mean deviation {self.deviation:.3g}{why})")
        if self.all_fit is not None and not self.all_fit.fits:
            return (f"{len(self.chosen)} marginals chosen by the exponential mechanism (measuring every workload "
                    f"marginal is excluded before any draw: {self.all_fit.reason}){refused}")
        return (f"{len(self.chosen)} marginals chosen by the exponential mechanism (measuring every workload "
                f"marginal would cost {self.expected_noise_all:.3g} L1 noise per marginal, above {share}the one-way "
                f"model's noisy mean deviation {self.deviation:.3g}{why}){refused}")


def run_wide_selection(plan: WideSelectionPlan, data, accountant, rng, *, mode: str = "auto") -> WideSelection:
    """Measure as the module notes say; every cost is charged before its draw.

    Parameters
    ----------
    plan : WideSelectionPlan
    data : Dataset
    accountant : Accountant
        Must afford the whole plan (checked before the first charge).
    rng : RandomSource
    mode : {"auto", "all", "select", "one-way"}
        ``"auto"``: the probe decides (steps 2 and 3); the others force a path (benchmarks, tests):
        the probe is still charged and drawn, so the ledger is the same. ``"one-way"`` is step 3's
        fallback: the rest measures the one-way marginals again.

    Returns
    -------
    WideSelection
        The measurements (one per marginal: the one-way marginals, then the workload's or the
        chosen ones) for :func:`~dpopt.estimate.marginal_space.estimate_marginals`.
    """
    if mode not in ("auto", "all", "select", "one-way"):
        raise ParameterError(f"mode must be 'auto', 'all', 'select' or 'one-way', got {mode!r}")
    from dpopt.model.queries.marginal import Marginal
    from dpopt.privacy.mechanisms import calibrate, exponential_mechanism, measure

    domain = plan.domain
    if not accountant.can_afford(_sum_costs(plan)):
        raise ParameterError(f"the wide selection plan needs {_amount(_sum_costs(plan))}; "
                             f"the accountant has {accountant.remaining} left")
    ones = [(a,) for a in domain.attrs]
    ones_query = _stack(domain, ones)
    measured = _measure_stack(ones_query, calibrate(ones_query, plan.one_way, plan.mechanism), data, accountant, rng,
                              "one-way marginals")
    one_way = {m.query.attrs: m.values for m in measured}
    total = float(np.mean([v.sum() for v in one_way.values()]))
    model = _Model(domain, one_way, total)
    candidates = _candidate_pool(plan.candidates, rng)
    true: dict[int, np.ndarray] = {}  # each pool candidate's marginal, read once (probe, then selection)

    def read(i: int) -> np.ndarray:
        if i not in true:
            true[i] = data.marginal(list(candidates[i]))
        return true[i]

    deviation = _probe([read(i) for i in range(len(candidates))], [model.counts(c) for c in candidates], plan,
                       accountant, rng)
    # Expected L1 noise of a workload marginal measured with an equal share of `rest` (public: the plan's).
    expected_all = plan.expected_noise_all
    allowed = plan.all_fit is None or plan.all_fit.fits
    fraction = plan.all_fraction
    if mode == "all" or (mode == "auto" and allowed and measures_all(expected_all, deviation, fraction)) \
            or not candidates:
        query_all = _stack(domain, plan.workload)
        law_all = calibrate(query_all, plan.rest, plan.mechanism)
        rest = _measure_stack(query_all, law_all, data, accountant, rng, "workload marginals",
                              {candidates[i]: v for i, v in true.items()})
        return WideSelection(measured + rest, "all", deviation, expected_all, [], total, plan.all_fit,
                             all_fraction=fraction)
    # Can the probe steer selection (module notes, step 3)? Public values and noisy releases only.
    first = calibrate(ones_query, plan.one_way, plan.mechanism)
    steer = model_noise(domain, candidates, _mean_abs(first), total) / max(deviation, 1.0)
    rounds_part, top_up, phi = plan.rest, plan.top_up, None
    # Pairs (module notes, *Rounds for pairs*): more rounds when their measurements' expected noise
    # (public) is small against the noisy deviation, and the exponential mechanism is not blind at
    # their smaller epsilon (else the rounds stay as planned, as before this rule).
    rounds = plan.rounds
    if plan.more_rounds and more_rounds_pay(plan.expected_noise_more_rounds, deviation):
        blind_more = selection_is_blind(len(candidates), plan.epsilon_more_rounds, total)
        rounds = plan.rounds if blind_more else plan.more_rounds
    if plan.top_up_rule and top_up is not None:
        # The share of the probe's deviation that the first model's one-way noise explains (public
        # expected noise over a noisy release): the top-up weighs the model's noise by it.
        one_cells = np.mean([sum(domain.project([a]).size for a in c) for c in candidates])
        phi = min(1.0, float(one_cells) * _mean_abs(first) / max(deviation, 1.0))
        # Below TOP_UP_NOISE_FRACTION real dependence dominates what selection ranks: no top-up.
        x = one_way_top_up(domain, candidates, rounds, plan.accounting, plan.select_share, phi) \
            if phi >= TOP_UP_NOISE_FRACTION else Fraction(0)
        top_up = _scale(plan.rest, x / (1 - ONE_WAY_SHARE - PROBE_SHARE)) if x else None
    # The first round's exponential-mechanism epsilon: its utility bound (selection_is_blind).
    first_eps = _round_costs(_scale(plan.rest if top_up is None else _minus(plan.rest, top_up),
                                    Fraction(1, rounds)), plan.accounting, plan.select_share)[2]
    blind = selection_is_blind(len(candidates), first_eps, total)
    steers = not (plan.one_way_fallback and steer >= 1)
    if mode == "one-way" or (mode == "auto" and (not steers or blind)):
        again = _measure_one_ways(domain, plan, data, accountant, rng)
        return WideSelection(measured + again, "one-way", deviation, expected_all, [], total, plan.all_fit,
                             Fraction(1) - ONE_WAY_SHARE - PROBE_SHARE, None, steer, blind=blind and steers,
                             all_fraction=fraction)
    if top_up is not None:
        # The second one-way measurement (one_way_top_up), combined with the first by inverse variance.
        again = _measure_stack(ones_query, calibrate(ones_query, top_up, plan.mechanism), data, accountant,
                               rng, "one-way marginals (selection's top-up)")
        w1, w2 = 1 / float(measured[0].variance), 1 / float(again[0].variance)
        one_way = {a.query.attrs: (w1 * a.values + w2 * b.values) / (w1 + w2) for a, b in zip(measured, again)}
        measured = measured + again
        total = float(np.mean([v.sum() for v in one_way.values()]))
        model = _Model(domain, one_way, total)
        rounds_part = _minus(plan.rest, top_up)
    modelled = {i: model.counts(c) for i, c in enumerate(candidates)}
    chosen: list[tuple] = []
    refused: list[tuple] = []  # picks not measured: the fit would be out of reach (step 3)
    open_ = np.ones(len(candidates), dtype=bool)
    sizes = np.array([domain.project(list(c)).size for c in candidates], dtype=np.float64)
    left, share, t = Fraction(1), Fraction(1, rounds), 0  # of `rounds_part`: still to spend, a round's
    grow = 4 if plan.accounting == "zcdp" else 2  # the noise scale halves (AIM: sigma / 2, epsilon x 2)
    while left > 0 and open_.any():
        part = left if left < 2 * share else share  # AIM: the last round takes all that is left
        select_cost, measure_cost, eps = _round_costs(_scale(rounds_part, part), plan.accounting, plan.select_share)
        law = calibrate(Marginal(domain, candidates[0]), measure_cost, plan.mechanism)  # any marginal: sens. 1
        penalty = sizes * _mean_abs(law)
        here = np.flatnonzero(open_)
        scores = selection_scores([read(i) for i in here], [modelled[i] for i in here], penalty[open_])
        pick = int(here[exponential_mechanism(scores, eps, accountant, rng, sensitivity=1.0,
                                              label=f"wide selection round {t + 1}")])
        attrs = candidates[pick]
        open_[pick] = False
        reach = fit_in_reach(domain, ones + chosen + [attrs], plan.workload, **plan.fit)
        if not reach.fits:
            # The fit would be out of reach (fit_in_reach): the pick is not measured, and its
            # measurement's share goes to the rounds to come (the ledger still sums to the budget).
            refused.append((attrs, reach.reason, len(chosen)))
            carried = measure_cost.rho / rounds_part.rho if plan.accounting == "zcdp" else \
                measure_cost.epsilon / rounds_part.epsilon
            left, t = left - part + carried, t + 1
            continue
        q = Marginal(domain, attrs)
        m = measure(q, data, calibrate(q, measure_cost, plan.mechanism), accountant, rng,
                    label=f"selected {', '.join(attrs)}", answers=read(pick))
        measured.append(m)
        chosen.append(attrs)
        before = modelled[pick]
        model.add(attrs, m.values)
        left, t = left - part, t + 1
        # AIM's annealing (Alg. 1, lines 13-14): when the measurement moved the model's answer on the
        # chosen marginal by no more than its own expected noise, the rounds are too noisy to see what
        # is left: halve the noise of the rounds to come. Reads noisy answers only (post-processing).
        if plan.anneal and np.abs(model.counts(attrs) - before).sum() <= sizes[pick] * _mean_abs(law):
            share = min(share * grow, left) if left > 0 else share
        # Candidates meeting the new set in two attributes or more change their model.
        touched = [i for i in np.flatnonzero(open_) if len(set(candidates[i]) & set(attrs)) >= 2]
        for i in touched:
            modelled[i] = model.counts(candidates[i])
            if set(candidates[i]) <= set(attrs):
                open_[i] = False  # a subset of a measured set: known
    whole = _sum_costs(plan)
    top_share = Fraction(0) if top_up is None else (top_up.rho / whole.rho if plan.accounting == "zcdp"
                                                    else top_up.epsilon / whole.epsilon)
    return WideSelection(measured, "select", deviation, expected_all, chosen, total, plan.all_fit, top_share, phi,
                         steer, refused, all_fraction=fraction, rounds=rounds)


def model_noise(domain, candidates, one_way_noise: float, total: float) -> float:
    """The expected L1 deviation of the selection model from the product of the *exact* one-way
    marginals that the one-way noise alone causes, on average over ``candidates`` (first order,
    capped): ``mean_C min(sum_{a in C} n_a E|z|, 2 n^)``. To first order the product's L1 error is the
    sum of its factors' (:func:`one_way_top_up`); the cap is the largest L1 distance between two
    tables of total ``n^`` (the model is normalised to the noisy total). Public: the cells ``n_a``,
    the one-way law's ``E|z|`` and the noisy total."""
    one_cells = np.array([sum(domain.project([a]).size for a in c) for c in candidates], dtype=np.float64)
    cap = 2.0 * max(float(total), 1.0)
    return float(np.mean(np.minimum(one_cells * float(one_way_noise), cap))) if len(one_cells) else 0.0


def selection_is_blind(candidates: int, epsilon, total: float) -> bool:
    """Whether the exponential mechanism's utility guarantee says nothing about the data: its pick
    scores at least ``OPT - 2 (ln|C| + t) / epsilon`` with probability ``1 - e^-t`` (sensitivity 1;
    Dwork and Roth 2014, Theorem 3.11, after McSherry and Talwar 2007 — the book is not in our
    search corpus, so the constant was not checked against it), and a candidate's deviation from
    the model lies in ``[0, 2 n^]`` (the L1 distance of two tables of total ``n^``). When even
    ``t = 0`` gives ``2 ln|C| / epsilon >= 2 n^`` the bound is weaker than any deviation can be:
    the pick is not guaranteed to beat a blind one (module notes, step 3). Public: the number of
    candidates, the round's epsilon and the noisy total."""
    return candidates > 1 and 2 * math.log(candidates) / float(epsilon) >= 2 * max(float(total), 1.0)


def one_way_weights(domain, workload) -> list:
    """Integer weights of the fallback's one-way measurements (module notes, step 3): attribute
    ``a`` (``n_a`` cells, in ``m_a`` workload sets) gets a share of the rest proportional to
    ``sqrt(m_a n_a)``: the integers ``round(1000 sqrt(m_a n_a))``, so each share is an exact fraction
    and the ledger sums exactly.

    Why: measured alone, ``a``'s marginal has L1 sensitivity 1, so under Laplace noise of scale
    ``1 / epsilon_a`` its expected L1 error is ``n_a / epsilon_a``; the workload's error adds each
    attribute's once per set holding it, ``sum_a m_a n_a / epsilon_a``, which under
    ``sum_a epsilon_a = epsilon`` is least at ``epsilon_a`` proportional to ``sqrt(m_a n_a)``
    (Lagrange: ``m_a n_a / epsilon_a^2`` equal across attributes). Against one stack of the d
    marginals (scale ``d / epsilon`` on every cell) the error ``(sum_a sqrt(m_a n_a))^2`` replaces ``d sum_a m_a n_a``: equal for equal attributes,
    smaller for adult's 2-100 values. Attributes in no workload set get 0 (not measured again)."""
    counts = {a: 0 for a in domain.attrs}
    for s in workload:
        for a in s:
            counts[a] += 1
    return [round(1000 * math.sqrt(counts[a] * domain.project([a]).size)) for a in domain.attrs]


def _measure_one_ways(domain, plan, data, accountant, rng) -> list:
    """The fallback's measurements: every workload attribute's one-way marginal alone, with a share
    of ``plan.rest`` proportional to :func:`one_way_weights` (Laplace noise; with Gaussian noise
    the stack, as the first measurement, since the rule is Laplace's)."""
    from dpopt.model.queries.marginal import Marginal
    from dpopt.privacy.mechanisms import calibrate, measure

    ones = [(a,) for a in domain.attrs]
    if plan.mechanism != "laplace":
        stack = _stack(domain, ones)
        return _measure_stack(stack, calibrate(stack, plan.rest, plan.mechanism), data, accountant, rng,
                              "one-way marginals (the rest: selection cannot pay for its noise)")
    weights = one_way_weights(domain, plan.workload)
    whole, out = sum(weights), []
    for (a,), w in zip(ones, weights):
        if w:
            q = Marginal(domain, (a,))
            out.append(measure(q, data, calibrate(q, _scale(plan.rest, Fraction(w, whole)), plan.mechanism),
                               accountant, rng, label=f"one-way {a} (the rest: selection cannot pay for its noise)"))
    return out


def _candidate_pool(candidates, rng) -> list:
    """Every candidate, or beyond ``CANDIDATE_LIMIT`` every pair and a uniform sample (without
    replacement) of the larger sets up to the limit. The sample is drawn from ``rng`` independently
    of the data, so each later step's privacy is as on a fixed candidate list."""
    candidates = list(candidates)
    if len(candidates) <= CANDIDATE_LIMIT:
        return candidates
    pairs = [c for c in candidates if len(c) == 2][:CANDIDATE_LIMIT]
    larger = [c for c in candidates if len(c) > 2]
    room = CANDIDATE_LIMIT - len(pairs)
    return pairs + [larger[i] for i in np.sort(_sample(len(larger), room, rng))] if room > 0 else pairs


def _sample(n: int, m: int, rng) -> np.ndarray:
    """``m`` of ``range(n)`` uniformly without replacement (random keys, sorted), from ``rng``."""
    keys = rng.uniform_below(2**62, n)
    return np.sort(np.argsort(keys, kind="stable")[:m])


def _minus(a: PrivacyCost, b: PrivacyCost) -> PrivacyCost:
    return PrivacyCost(epsilon=a.epsilon - b.epsilon, delta=a.delta - b.delta,
                       rho=None if a.rho is None else a.rho - b.rho)


def _sum_costs(plan: WideSelectionPlan) -> PrivacyCost:
    a, b, c = plan.one_way, plan.probe, plan.rest
    return PrivacyCost(epsilon=a.epsilon + b.epsilon + c.epsilon, delta=a.delta + b.delta + c.delta,
                       rho=None if a.rho is None else a.rho + b.rho + c.rho)


def _mean_abs(law) -> float:
    """``E|noise|`` of one answer: Laplace ``~ b``, Gaussian ``sqrt(2/pi) sigma`` (continuous values)."""
    return float(law.scale) if law.mechanism == "laplace" else math.sqrt(2 / math.pi) * float(law.scale)


def _stack(domain, sets):
    from dpopt.model.queries.combine import Stack
    from dpopt.model.queries.marginal import Marginal

    parts = [Marginal(domain, s) for s in sets]
    return parts[0] if len(parts) == 1 else Stack(parts)


def _law_of_share(domain, sets, cost, mechanism):
    from dpopt.privacy.mechanisms import calibrate

    return calibrate(_stack(domain, sets), cost, mechanism)


def _measure_stack(query, law, data, accountant, rng, label, known=None) -> list:
    """Every marginal of the stack ``query`` in one measurement of law ``law``, split per marginal
    (``known``: true answers already read, by attribute set)."""
    from dpopt.model.measurement import Measurement
    from dpopt.privacy.mechanisms import measure

    parts = list(getattr(query, "parts", [query]))
    known = known or {}
    answers = np.concatenate([known[q.attrs] if q.attrs in known else data.marginal(list(q.attrs))
                              for q in parts]).astype(np.float64)
    stacked = measure(query, data, law, accountant, rng, label=label, answers=answers)
    ends = np.cumsum([q.num_rows for q in parts])[:-1]
    return [Measurement(q, v, stacked.noise, stacked.scale, stacked.variance, None, ", ".join(q.attrs))
            for q, v in zip(parts, np.split(stacked.values, ends))]


def _probe(true, modelled, plan, accountant, rng) -> float:
    """Step 2: the mean deviation from the model, released with sensitivity-1 noise (module notes).

    ``true`` holds every candidate or, beyond ``CANDIDATE_LIMIT``, every pair and a uniform sample
    of the larger sets (``m`` in all), drawn independently of the data (:func:`_candidate_pool`). The sensitivity is 1 either way: adding or removing one record
    moves each term ``||M_C(x) - m_C||_1`` by at most 1, so the mean of any fixed list of ``m``
    terms by at most ``m / m = 1``; rounding to an integer keeps it (module notes, step 2). The
    mean over the pool stands for the mean over every candidate (unbiased within pairs and within
    larger sets)."""
    from dpopt.privacy.samplers import discrete_gaussian, discrete_laplace

    if not true:
        return 0.0
    value = round(float(np.mean([np.abs(t - m).sum() for t, m in zip(true, modelled)])))
    cost = plan.probe
    if plan.accounting == "zcdp":
        accountant.charge(cost, "wide selection: deviation probe", detail="discrete Gaussian, sensitivity 1")
        noise = discrete_gaussian(1 / (2 * cost.rho), 1, rng)[0]
    else:
        cost = PrivacyCost.pure(cost.epsilon) if plan.accounting == "pure" else \
            PrivacyCost.approx(cost.epsilon, cost.delta)
        accountant.charge(cost, "wide selection: deviation probe", detail="discrete Laplace, sensitivity 1")
        noise = discrete_laplace(1 / cost.epsilon, 1, rng)[0]
    return float(value + noise)
