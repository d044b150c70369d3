"""The expert: a program that writes real kernels for the tasks it can fuse, played through the agent's environment
as episodes that `rft` trains on (docs/training.md)."""
