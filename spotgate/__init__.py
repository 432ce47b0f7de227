"""spotgate: LLM serving on EC2 spot GPUs behind a lightweight edge gateway."""

__version__ = "0.1.0"
