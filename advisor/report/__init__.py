"""Everything a run shows: summary.json (typed, versioned), report.md and the plots, from the study alone."""

from advisor.report.schema import SCHEMA_VERSION, Summary, load_summary

__all__ = ["SCHEMA_VERSION", "Summary", "load_summary"]
