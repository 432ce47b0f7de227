"""The `spotgate` command line: above every service, it starts and steers them."""

import signal
from types import FrameType


def run() -> int:
    """Entry point of the `spotgate` console script and of `python -m cli`.

    Loading the commands takes a second. A Ctrl-C then is noted, not raised: raised inside a
    native module's import it can abort it with a traceback (pydantic's panics); once loaded,
    the command ends at once with 130, as a Ctrl-C later ends it (`cli.main`).
    """
    interrupted: list[int] = []

    def note(signum: int, _frame: FrameType | None) -> None:
        interrupted.append(signum)

    previous = signal.signal(signal.SIGINT, note)
    try:
        from cli.args import EXIT_INTERRUPTED
        from cli.main import main
    finally:
        signal.signal(signal.SIGINT, previous)
    return EXIT_INTERRUPTED if interrupted else main()
