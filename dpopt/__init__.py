"""dpopt: differentially private data release as noisy measurement plus consistency optimization."""

__version__ = "0.1.0"
