"""The audit's defaults, in a module of their own so that ``dpopt --help`` can show them without
importing the audit (scipy.stats, pandas)."""

#: Runs of each dataset of the chosen pair: half for the event search, half for the test.
DEFAULT_RUNS = 10_000
#: Cells of the audit domain unless ``--domain-limit`` says otherwise.
DEFAULT_DOMAIN_LIMIT = 16
