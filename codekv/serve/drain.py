"""Draining on SIGTERM (or a first Ctrl-C): the requests in flight finish, streams included,
and the model's work after their replies (storing new segments), while new ones get 503 with
Retry-After (and ``/health`` says ``draining``, for a load balancer); then uvicorn's own
shutdown. A second signal, or ``DRAIN_S`` without the last
request finishing, shuts down at once, as uvicorn alone would.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable

import uvicorn
from sse_starlette.sse import AppStatus

DRAIN_S = 30.0


class Drain:
    """Whether the server drains, and the requests in flight (``InFlight`` counts them);
    ``idle`` says whether the model has work left after them."""

    def __init__(self, idle: Callable[[], bool] = lambda: True):
        self.idle = idle
        self.in_flight = 0
        self.signal: int | None = None
        self._since = 0.0

    @property
    def draining(self) -> bool:
        return self.signal is not None

    def begin(self, sig: int) -> None:
        self.signal, self._since = sig, time.monotonic()

    def done(self) -> bool:
        return (self.in_flight == 0 and self.idle()) or time.monotonic() - self._since > DRAIN_S


class InFlight:
    """ASGI middleware counting each request from its arrival to its response's last byte."""

    def __init__(self, app, drain: Drain):
        self.app, self.drain = app, drain

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        self.drain.in_flight += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.drain.in_flight -= 1


class DrainingServer(uvicorn.Server):
    """uvicorn, whose first exit signal drains ``drain`` before its own shutdown starts."""

    def __init__(self, config: uvicorn.Config, drain: Drain):
        super().__init__(config)
        self.drain = drain
        # sse-starlette ends every stream at uvicorn's first signal: here they finish first.
        AppStatus.disable_automatic_graceful_drain()

    def handle_exit(self, sig: int, frame) -> None:
        if self.drain.draining:  # a second signal: no more waiting
            super().handle_exit(sig, frame)
        else:
            self.drain.begin(sig)

    async def on_tick(self, counter: int) -> bool:
        if self.drain.draining and not self.should_exit and self.drain.done():
            super().handle_exit(self.drain.signal or signal.SIGTERM, None)
        return await super().on_tick(counter)
