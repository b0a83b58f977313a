"""planner: an auto-parallel planner for distributed LLM training."""

__version__ = "0.1.0"
