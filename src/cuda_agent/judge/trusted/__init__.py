"""The trusted side: code that runs in the reference worker (and the baseline callee it starts) and never in the
candidate's process. It draws every input, drives every call of the candidate, keeps the clock, reads the outputs
back from the candidate's memory and compares them. Nothing here believes a number the candidate's process made."""
