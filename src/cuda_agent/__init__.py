"""cuda-agent: LLM agents that write verified CUDA kernels faster than torch.compile, and the RL system around them.

Data flows: task (reference module) -> workspace (candidate kernels) -> judge (build, verify, profile) -> reward.
"""

__version__ = "0.1.0"
