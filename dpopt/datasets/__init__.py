"""Example data that dpopt generates itself (never copies of real data)."""

from dpopt.datasets.census import (
    CENSUS_ATTRS,
    STRUCTURAL_ZEROS,
    census_domain,
    county_parent,
    generate_census,
    state_totals,
    structural_zero_mask_of_records,
    structural_zero_rule_masks,
    structural_zero_rules,
    write_example_data,
)

__all__ = [
    "CENSUS_ATTRS",
    "STRUCTURAL_ZEROS",
    "census_domain",
    "county_parent",
    "generate_census",
    "state_totals",
    "structural_zero_mask_of_records",
    "structural_zero_rule_masks",
    "structural_zero_rules",
    "write_example_data",
]
