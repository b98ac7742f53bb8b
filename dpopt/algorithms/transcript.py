"""The measurement transcript: the noisy answers an iterative algorithm drew, released as a table.

MWEM (Hardt, Ligett, McSherry, NIPS 2012, Fig. 1) and DualQuery (Gaboardi et al., ICML 2014)
release a fit -- a table or records -- computed from their mechanisms' outputs: the selected
queries, their noisy measurements and (with ``count_share``) the noisy record count. The
proofs of their privacy (MWEM's Theorem 2.1; :mod:`dpopt.algorithms.record_count`) compose
exactly these outputs; the fit is post-processing of them. Releasing the transcript as well
therefore costs no privacy: the guarantee already covers it, as it covers Private-PGM's
measurement log (McKenna, Sheldon, Miklau, ICML 2019) and the measurements every
``[[measure]]`` release publishes in its ``noisy`` column.

**Why an option.** The fit hides the answers' low-order bits: MWEM's table and DualQuery's
records are rounded or scaled from an integer count, so a privacy audit of the release alone
cannot see a mechanism whose noise leaves the true answer's trace in those bits (the
floating-point Laplace mechanism, Mironov, CCS 2012). An audit of the release with its
transcript tests every mechanism output, and since the release is a function of the
transcript (and of the public workload), a bound for the transcript bounds the release too.
The option changes no other output and no ledger entry: it only writes down values the run
has already drawn.

One row per noisy answer, in the order drawn:

``step``
    The measurement's ledger label (``record count``, ``mwem round 3: measure``, ...).
``query``
    The measured query's name: the selected block's (a marginal's attributes, a range batch).
``block``
    The selected block's position in the workload (the exponential mechanism's choice; -1 for
    a measurement outside the workload, such as the record count).
``row``
    The answer's row in that block (or in the measured query when ``block`` is -1).
``noisy``
    The noisy answer, exactly as drawn and used (float64, bit for bit).
``stddev``
    Its noise's standard deviation.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import pandas as pd

__all__ = ["TRANSCRIPT_COLUMNS", "TRANSCRIPT_STATISTICS", "transcript_frame"]

#: The columns of a transcript, in order (module notes).
TRANSCRIPT_COLUMNS = ("step", "query", "block", "row", "noisy", "stddev")
#: The columns a privacy audit reads as output statistics: the noisy answers. ``block`` and
#: ``row`` are labels, not quantities (the audit's thresholds and scores would read their codes as
#: numbers, and at 800 runs they cost MWEM's audit configuration 2 of 4 halved-scale catches); the
#: selections they record are audited through the released table, which is fitted to them.
TRANSCRIPT_STATISTICS = ("noisy",)


def transcript_frame(measurements: Sequence, selections: Sequence[tuple[int, np.ndarray, str]] | None = None
                     ) -> pd.DataFrame:
    """The transcript of ``measurements`` (module notes).

    Parameters
    ----------
    measurements : sequence of Measurement
        In the order drawn.
    selections : sequence of (block, rows, name), optional
        For each measurement, the workload block it measured, the rows of that block and the
        block's name; ``None`` for a measurement outside the workload (``block`` -1, ``row``
        its own rows, ``query`` its own name). Default: every measurement outside the workload.

    Returns
    -------
    DataFrame
        One row per noisy answer, columns :data:`TRANSCRIPT_COLUMNS`.
    """
    selections = list(selections) if selections is not None else [None] * len(measurements)
    if len(selections) != len(measurements):
        raise ValueError(f"{len(selections)} selections for {len(measurements)} measurements")
    pieces = []
    for m, chosen in zip(measurements, selections):
        values = np.asarray(m.values, dtype=np.float64).ravel()
        if chosen is None:
            block, rows, name = -1, np.arange(values.size), m.query.name
        else:
            block, rows, name = chosen
            rows = np.asarray(rows, dtype=np.int64).ravel()
        if rows.size != values.size:
            raise ValueError(f"measurement {m.label!r}: {values.size} answers for {rows.size} rows")
        pieces.append(pd.DataFrame({"step": m.label, "query": name, "block": np.int64(block),
                                    "row": rows.astype(np.int64), "noisy": values,
                                    "stddev": np.float64(m.stddev)}))
    if not pieces:
        return pd.DataFrame({c: pd.Series(dtype=t) for c, t in zip(
            TRANSCRIPT_COLUMNS, (object, object, np.int64, np.int64, np.float64, np.float64))})
    return pd.concat(pieces, ignore_index=True)[list(TRANSCRIPT_COLUMNS)]
