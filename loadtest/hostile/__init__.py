"""Hostile input against a live gateway and agent: no crash, nobody gets in, no secret logged.

    python -m loadtest.hostile [--examples 500] [--slow-connections 200] [--write FILE]

The stack is real processes: an AWS emulator (moto server, in this process), the gateway and
one synthetic agent that verifies tokens against the gateway's JWKS, both logging JSON at
debug level to files. Each class of input is thrown at both services: hypothesis-generated
websocket frames, HTTP bodies and headers; forged, oversized, expired and retired JWTs; API
key guessing; foreign browser origins; slow senders; a client that never reads. Every
answer is checked (a 4xx has OpenAI's JSON error body, nothing is a 5xx, a socket either
lives on or closes with a documented code), and at the end every captured log line is
searched for the API keys, the tokens and the signing keys used. One table row per class.
"""

from loadtest.hostile.battery import run_battery
from loadtest.hostile.report import Row, render

__all__ = ["Row", "render", "run_battery"]
