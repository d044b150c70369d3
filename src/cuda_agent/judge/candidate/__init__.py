"""The untrusted side: code that runs in the candidate's process. Everything in that process (threads, hooks,
modules, memory) is the candidate's, this code included: it serves the trusted side's calls and runs the in-process
audits, whose findings count only as a second line (their having run is checked by a challenge)."""
