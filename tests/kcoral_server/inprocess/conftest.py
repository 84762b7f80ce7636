"""The server's app in process, through the client: its retry waits are recorded the way
the client's own in-process tests record them (one fixture, kept beside the fake server)."""
from tests.kcoral.inprocess.conftest import no_sleep

__all__ = ["no_sleep"]
