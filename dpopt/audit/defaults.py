"""The audit's defaults, in a module of their own so that ``dpopt --help`` can show them without
importing the audit (scipy.stats, pandas)."""

#: Runs of each dataset of the chosen pair: half for the event search, half for the test.
DEFAULT_RUNS = 10_000
#: Cells of the audit domain that can hold a record, unless ``--domain-limit`` says otherwise.
DEFAULT_DOMAIN_LIMIT = 16
#: ``runs = "auto"``: the excess over the claim to detect (a fraction of the claimed epsilon), and the
#: seconds the whole audit may take.
DEFAULT_EXCESS, DEFAULT_TIME_BUDGET = 0.25, 600.0
