"""dpopt."""
