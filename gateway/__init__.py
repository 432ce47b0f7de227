"""The edge gateway: API keys, tokens, websocket and OpenAI routing, failover."""
