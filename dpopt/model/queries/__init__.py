"""Linear queries over a domain: matrix-free operators with exact sensitivities.

Every query is a :class:`~dpopt.model.queries.base.LinearQuery` (``matvec``, ``rmatvec``,
``to_sparse``, ``column_norm_powers``, ``sensitivity``, ``support``/``restrict``,
``row_labels``).
"""

from dpopt.model.queries.base import LinearQuery, column_norms_of_matrix
from dpopt.model.queries._common import (
    StructuredQuery,
    SupportArray,
    abs_power_rmatvec,
    depends_on,
    marginalize,
    restrict_query,
    support_norm_powers,
)
from dpopt.model.queries.basic import Identity, Total
from dpopt.model.queries.binary import BinaryEncoding, binary_encoding
from dpopt.model.queries.combine import Stack, Weighted
from dpopt.model.queries.literal_conjunctions import Conjunctions, distinct_records
from dpopt.model.queries.explicit import SparseQuery
from dpopt.model.queries.fourier import (
    FourierParity,
    downward_closure,
    fast_walsh_hadamard,
    marginal_from_fourier,
)
from dpopt.model.queries.hierarchical import Hierarchical, tree_intervals
from dpopt.model.queries.kronecker import Kronecker
from dpopt.model.queries.lifted import Lifted
from dpopt.model.queries.marginal import Marginal, all_marginals
from dpopt.model.queries.marginal_workload import MarginalWorkload, WorkloadEvaluator
from dpopt.model.queries.pidentity import PIdentity
from dpopt.model.queries.predicate_count import PredicateCount
from dpopt.model.queries.ranges import AllRanges, Prefix, RangeQueries, random_ranges
from dpopt.model.queries.residual import Residuals, contrast_basis, residual_dimension, residual_row_norm2
from dpopt.model.queries.selected import SelectedRows
from dpopt.model.queries.wavelet import HaarWavelet

__all__ = [
    "AllRanges",
    "BinaryEncoding",
    "Conjunctions",
    "FourierParity",
    "HaarWavelet",
    "Hierarchical",
    "Identity",
    "Kronecker",
    "Lifted",
    "LinearQuery",
    "Marginal",
    "MarginalWorkload",
    "PIdentity",
    "PredicateCount",
    "Prefix",
    "RangeQueries",
    "Residuals",
    "SparseQuery",
    "Stack",
    "SelectedRows",
    "StructuredQuery",
    "SupportArray",
    "Total",
    "Weighted",
    "WorkloadEvaluator",
    "abs_power_rmatvec",
    "all_marginals",
    "binary_encoding",
    "column_norms_of_matrix",
    "contrast_basis",
    "depends_on",
    "distinct_records",
    "downward_closure",
    "fast_walsh_hadamard",
    "marginal_from_fourier",
    "marginalize",
    "random_ranges",
    "residual_dimension",
    "residual_row_norm2",
    "restrict_query",
    "support_norm_powers",
    "tree_intervals",
]
