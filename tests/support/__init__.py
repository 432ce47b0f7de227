"""What the suites share: agents and engines, tokenizers, a websocket client, metrics."""
