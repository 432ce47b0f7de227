"""The GPU agent: runs vLLM on an instance, registers when ready, drains on a spot notice."""
