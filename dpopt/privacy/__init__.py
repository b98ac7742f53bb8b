"""The private side: exact noise from a secure source, budgets and the accountant, mechanisms.

Only this layer draws random numbers. Every mechanism derives its noise from the query's
sensitivity (:func:`calibrate`) and charges the :class:`Accountant` before it samples.
"""

from dpopt.privacy.accountant import Accountant, PrivacyCost
from dpopt.privacy.budget import Budget
from dpopt.privacy.mechanisms import (
    NoiseLaw,
    calibrate,
    exponential_mechanism,
    gaussian_mechanism,
    laplace_mechanism,
    measure,
    report_noisy_max,
)
from dpopt.privacy.randomness import RandomSource, make_random

__all__ = [
    "Accountant", "PrivacyCost", "Budget", "NoiseLaw", "calibrate", "measure", "laplace_mechanism",
    "gaussian_mechanism", "exponential_mechanism", "report_noisy_max", "RandomSource", "make_random",
]
