"""The processes' logs afterwards: no secret in any line, no unhandled error."""

from __future__ import annotations

from loadtest.hostile.report import Row
from loadtest.hostile.stack import HostileStack
from spotgate.logging import PARSER_REFUSAL_EVENT


def _masked(line: str, secrets: set[str]) -> str:
    """The line with every secret in it replaced by `<secret>` (longest first)."""
    for secret in sorted(secrets, key=len, reverse=True):
        line = line.replace(secret, "<secret>")
    return line


def log_rows(stack: HostileStack) -> list[Row]:
    """No secret in any log line; no unhandled error; both services still running."""
    lines = stack.log_lines()
    files = sorted({name for name, _line in lines})
    leaks = Row(
        "all processes",
        f"secrets in logs: {len(stack.secrets)} API keys, secret "
        "halves, issued tokens and signing key lines searched for",
    )
    leaked = [(name, line) for name, line in lines for secret in stack.secrets if secret in line]
    leaks.record(
        f"{len(lines)} lines in {', '.join(files)}: {len(leaked)} secrets",
        f"{leaked[0][0]} logs a secret: {_masked(leaked[0][1], stack.secrets)[:400]}"
        if leaked
        else None,
    )
    redacted = sum("[redacted]" in line for _name, line in lines)
    leaks.notes.append(f"{redacted} lines carry `[redacted]` where a credential was")
    crashes = Row(
        "all processes",
        "unhandled errors: tracebacks, aiohttp's 'Error handling request', critical lines; exits",
    )
    bad = [
        (name, line)
        for name, line in lines
        if "Traceback" in line or "Error handling request" in line or '"critical"' in line
    ]
    crashes.record(f"{len(bad)} such lines", f"{bad[0][0]}: {bad[0][1][:300]}" if bad else None)
    refused = sum(PARSER_REFUSAL_EVENT in line for _name, line in lines)
    crashes.notes.append(f"{refused} warnings (no traceback) for requests aiohttp's parser refused")
    try:
        stack.processes.check()
        crashes.notes.append("gateway and agent running at the end")
    except Exception as err:
        crashes.problems.append(str(err))
    return [leaks, crashes]
