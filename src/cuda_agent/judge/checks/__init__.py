"""Checks the judge's own process runs on what the candidate hands in: its sources (the policy's rules) and the
native libraries it built (their symbols)."""
