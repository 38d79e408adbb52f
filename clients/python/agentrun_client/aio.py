"""The asyncio client: Client's methods, awaited; listings and watches as async iterators."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from datetime import datetime
from types import TracebackType
from typing import Any, TypeVar

import grpc

from agentrun_client._ops import Call, watch_event
from agentrun_client.base import ClientBase
from agentrun_client.config import aio_channel
from agentrun_client.errors import AgentrunError, from_rpc_error
from agentrun_client.types import (
    Approval,
    Delta,
    Event,
    Page,
    Run,
    Session,
    Signal,
    Step,
    Turn,
)

T = TypeVar("T")


class AsyncClient(ClientBase[grpc.aio.Channel]):
    """Client for asyncio code (same arguments, same methods).

    async with AsyncClient() as client:
        run = await client.start_run("triage", "Follow up with ada@example.com")
        async for step in client.watch(run.run_id):
            print(step.seq, step.kind, step.payload)
    """

    _open = staticmethod(aio_channel)

    async def close(self) -> None:
        await self._channel.close()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def _do(self, call: Call[T]) -> T:
        method = getattr(self._stubs[call.service], call.method)
        attempt = 0
        while True:
            try:
                return call.convert(await method(call.request, timeout=self.timeout))
            except grpc.aio.AioRpcError as err:
                attempt += 1
                if err.code() != grpc.StatusCode.UNAVAILABLE or attempt >= self.retry.attempts:
                    raise from_rpc_error(err) from None
                await asyncio.sleep(self.retry.delay(attempt - 1))

    async def _pages(self, first: Call[Page[T]], again: Any) -> AsyncIterator[T]:
        page = await self._do(first)
        while True:
            for item in page.items:
                yield item
            if not page.next_page_token:
                return
            page = await self._do(again(page.next_page_token))

    # --- runs ---------------------------------------------------------------------------------

    async def start_run(
        self,
        agent: str,
        input: str,
        *,
        request_id: str | None = None,
        agent_version: int = 0,
        priority: int = 0,
        trigger_connection_id: str = "",
    ) -> Run:
        return await self._do(
            self._ops.start_run(
                agent, input, request_id, agent_version, priority, trigger_connection_id
            )
        )

    async def get_run(self, run_id: str) -> Run:
        return await self._do(self._ops.get_run(run_id))

    async def cancel_run(self, run_id: str, reason: str = "") -> Run:
        return await self._do(self._ops.cancel_run(run_id, reason))

    async def fork_run(
        self, run_id: str, from_seq: int, *, agent_version: int = 0, priority: int | None = None
    ) -> Run:
        return await self._do(self._ops.fork_run(run_id, from_seq, agent_version, priority))

    async def signal_run(
        self, run_id: str, name: str, payload: Any = None, *, event_id: str | None = None
    ) -> Signal:
        return await self._do(self._ops.signal_run(run_id, name, payload, event_id))

    async def publish_event(
        self, name: str, body: dict[str, Any], *, event_id: str | None = None
    ) -> Event:
        return await self._do(self._ops.publish_event(name, body, event_id))

    async def resolve_unknown_outcome(
        self, run_id: str, seq: int, decision: str, *, decided_by: str, note: str = ""
    ) -> Run:
        return await self._do(
            self._ops.resolve_unknown_outcome(run_id, seq, decision, decided_by, note)
        )

    async def list_runs_page(
        self,
        *,
        page_token: str = "",
        page_size: int = 100,
        agent: str | None = None,
        status: str | None = None,
        since: datetime | None = None,
        search: str | None = None,
        forked_from: str | None = None,
    ) -> Page[Run]:
        return await self._do(
            self._ops.list_runs_page(
                page_token, page_size, agent, status, since, search, forked_from
            )
        )

    def list_runs(
        self,
        *,
        agent: str | None = None,
        status: str | None = None,
        since: datetime | None = None,
        search: str | None = None,
        forked_from: str | None = None,
        page_size: int = 100,
    ) -> AsyncIterator[Run]:
        filters = (agent, status, since, search, forked_from)
        return self._pages(
            self._ops.list_runs_page("", page_size, *filters),
            lambda token: self._ops.list_runs_page(token, page_size, *filters),
        )

    def list_steps(
        self, run_id: str, from_seq: int = 0, *, page_size: int = 200
    ) -> AsyncIterator[Step]:
        return self._pages(
            self._ops.list_steps_page(run_id, from_seq, page_size),
            lambda token: self._ops.list_steps_page(run_id, int(token), page_size),
        )

    async def watch_events(
        self,
        run_id: str,
        from_seq: int = 0,
        *,
        deltas: bool = False,
    ) -> AsyncIterator[Step | Run | Delta]:
        """As Client.watch_events: reconnects after UNAVAILABLE from the step after the last
        one yielded, for up to retry.watch_for seconds of unreachability. Bound it with
        `asyncio.timeout()` (the async methods take no timeout of their own)."""
        request = self._ops.watch(run_id, from_seq, deltas)
        delay, down_since = 0.2, None
        while True:
            call = self.runs.WatchRun(request)
            try:
                async for raw in call:
                    down_since, delay = None, 0.2
                    if raw.HasField("step"):
                        request.from_seq = max(request.from_seq, raw.step.seq + 1)
                    yield watch_event(raw)
                return
            except grpc.aio.AioRpcError as err:
                now = time.monotonic()
                down_since = down_since or now
                if (
                    err.code() != grpc.StatusCode.UNAVAILABLE
                    or now + delay - down_since > self.retry.watch_for
                ):
                    raise from_rpc_error(err) from None
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)
            finally:
                call.cancel()

    async def watch(self, run_id: str, from_seq: int = 0) -> AsyncIterator[Step]:
        async for event in self.watch_events(run_id, from_seq):
            if isinstance(event, Step):
                yield event

    async def wait(self, run_id: str) -> Run:
        async for event in self.watch_events(run_id, 1 << 30):
            if isinstance(event, Run) and event.done:
                break
        run = await self.get_run(run_id)
        if not run.done:
            raise AgentrunError(f"run {run_id} is still {run.status}", grpc.StatusCode.UNKNOWN)
        return run

    async def start_and_wait(self, agent: str, input: str, **start: Any) -> Run:
        run = await self.start_run(agent, input, **start)
        return await self.wait(run.run_id)

    # --- approvals ----------------------------------------------------------------------------

    def list_approvals(
        self, *, state: str | None = None, approver: str | None = None, page_size: int = 100
    ) -> AsyncIterator[Approval]:
        return self._pages(
            self._ops.list_approvals_page("", page_size, state, approver),
            lambda token: self._ops.list_approvals_page(token, page_size, state, approver),
        )

    async def get_approval(self, approval_id: str) -> Approval:
        return await self._do(self._ops.get_approval(approval_id))

    async def approve(self, approval_id: str, *, arguments: Any = None, note: str = "") -> Approval:
        return await self._do(self._ops.decide(approval_id, True, arguments=arguments, note=note))

    async def deny(self, approval_id: str, reason: str = "") -> Approval:
        return await self._do(self._ops.decide(approval_id, False, reason=reason))

    # --- sessions -----------------------------------------------------------------------------

    async def create_session(
        self, agent: str, *, title: str = "", strategy: str | None = None
    ) -> Session:
        return await self._do(self._ops.create_session(agent, title, strategy))

    async def send_message(
        self,
        session_id: str,
        text: str,
        *,
        request_id: str | None = None,
        strategy: str | None = None,
        priority: int = 0,
    ) -> Turn:
        return await self._do(
            self._ops.send_message(session_id, text, request_id, strategy, priority)
        )
