"""Everything a run shows: summary.json (typed, versioned), report.md and the plots, from the study alone."""

from advisor.report.schema import SCHEMA_VERSION, Summary, load_summary
from advisor.report.verify_record import VerifyResult, load_verify

__all__ = ["SCHEMA_VERSION", "Summary", "VerifyResult", "load_summary", "load_verify"]
