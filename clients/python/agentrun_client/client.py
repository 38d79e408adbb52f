"""The blocking client. AsyncClient (agentrun_client/aio.py) has the same methods."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from datetime import datetime
from types import TracebackType
from typing import Any, TypeVar

import grpc

from agentrun_client._ops import Call, watch_event
from agentrun_client.base import ClientBase
from agentrun_client.config import sync_channel
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
from agentrun_client.watch import RunWatch

T = TypeVar("T")


class Client(ClientBase[grpc.Channel]):
    """A workspace's runs, approvals and sessions over one gRPC channel.

        with Client() as client:      # address and key as the `agentrun` CLI finds them
            run = client.start_and_wait("triage", "Follow up with ada@example.com")

    Arguments left out come from the environment, the profile, then a running
    `agentrun dev` (agentrun_client/config.py). `role` picks which of a dev stack's keys to
    use when nothing names a key ("approver" decides approvals).
    """

    _open = staticmethod(sync_channel)

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def _do(self, call: Call[T]) -> T:
        method = getattr(self._stubs[call.service], call.method)
        attempt = 0
        while True:
            try:
                return call.convert(method(call.request, timeout=self.timeout))
            except grpc.RpcError as err:
                attempt += 1
                if err.code() != grpc.StatusCode.UNAVAILABLE or attempt >= self.retry.attempts:
                    raise from_rpc_error(err) from None
                self._pause(self.retry.delay(attempt - 1))

    def _pause(self, delay: float) -> None:
        """Wait `delay` seconds, or less if the channel connects first. Watching the channel
        also drives its reconnection: without a call in progress, a blocking channel may not
        notice for seconds that the control plane is back."""
        with contextlib.suppress(grpc.FutureTimeoutError):
            grpc.channel_ready_future(self._channel).result(timeout=delay)

    def _pages(self, first: Call[Page[T]], again: Any) -> Iterator[T]:
        page = self._do(first)
        while True:
            yield from page.items
            if not page.next_page_token:
                return
            page = self._do(again(page.next_page_token))

    # --- runs ---------------------------------------------------------------------------------

    def start_run(
        self,
        agent: str,
        input: str,
        *,
        request_id: str | None = None,
        agent_version: int = 0,
        priority: int = 0,
        trigger_connection_id: str = "",
    ) -> Run:
        """Admit a run of `agent`'s latest (or `agent_version`) version. The same `request_id`
        again returns the same run; without one the client makes one, so its own retries
        never start a second run."""
        return self._do(
            self._ops.start_run(
                agent, input, request_id, agent_version, priority, trigger_connection_id
            )
        )

    def get_run(self, run_id: str) -> Run:
        return self._do(self._ops.get_run(run_id))

    def cancel_run(self, run_id: str, reason: str = "") -> Run:
        return self._do(self._ops.cancel_run(run_id, reason))

    def fork_run(
        self, run_id: str, from_seq: int, *, agent_version: int = 0, priority: int | None = None
    ) -> Run:
        """A new run whose log is a copy of `run_id`'s up to `from_seq`, then continues live."""
        return self._do(self._ops.fork_run(run_id, from_seq, agent_version, priority))

    def signal_run(
        self, run_id: str, name: str, payload: Any = None, *, event_id: str | None = None
    ) -> Signal:
        """Send a named event (any JSON value); idempotent by `event_id` (made if not given)."""
        return self._do(self._ops.signal_run(run_id, name, payload, event_id))

    def publish_event(
        self, name: str, body: dict[str, Any], *, event_id: str | None = None
    ) -> Event:
        """Publish a named event (a JSON object) to the workspace: it wakes the runs whose
        wait_for_event it matches; idempotent by `event_id` (made if not given)."""
        return self._do(self._ops.publish_event(name, body, event_id))

    def resolve_unknown_outcome(
        self, run_id: str, seq: int, decision: str, *, decided_by: str, note: str = ""
    ) -> Run:
        """Decide a tool call whose outcome is unknown: happened, not_happened, retry or
        fail_run (`seq`: its tool_result step)."""
        return self._do(self._ops.resolve_unknown_outcome(run_id, seq, decision, decided_by, note))

    def list_runs_page(
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
        return self._do(
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
    ) -> Iterator[Run]:
        """Every matching run, newest first, fetching pages as the iteration goes."""
        filters = (agent, status, since, search, forked_from)
        return self._pages(
            self._ops.list_runs_page("", page_size, *filters),
            lambda token: self._ops.list_runs_page(token, page_size, *filters),
        )

    def list_steps(self, run_id: str, from_seq: int = 0, *, page_size: int = 200) -> Iterator[Step]:
        """The run's log from `from_seq` to the last step committed now."""
        return self._pages(
            self._ops.list_steps_page(run_id, from_seq, page_size),
            lambda token: self._ops.list_steps_page(run_id, int(token), page_size),
        )

    def watch_events(
        self,
        run_id: str,
        from_seq: int = 0,
        *,
        timeout: float | None = None,
        deltas: bool = False,
    ) -> Iterator[Step | Run | Delta]:
        """The run's state (Run) when it changes, its steps from `from_seq` as they commit,
        and with `deltas` the model's text as it comes; ends when the run is over. After
        UNAVAILABLE it reconnects from the step after the last one yielded."""
        watch = RunWatch(
            self.runs,
            self.workspace,
            run_id,
            from_seq,
            timeout=timeout,
            retry_for=self.retry.watch_for,
            retry_unopened=True,
            deltas=deltas,
            channel=self._channel,
        )
        try:
            for event in watch:
                yield watch_event(event)
        except grpc.RpcError as err:
            raise from_rpc_error(err) from None
        finally:
            watch.cancel()

    def watch(
        self, run_id: str, from_seq: int = 0, *, timeout: float | None = None
    ) -> Iterator[Step]:
        """The run's steps from `from_seq`, as they commit, until the run is over."""
        for event in self.watch_events(run_id, from_seq, timeout=timeout):
            if isinstance(event, Step):
                yield event

    def wait(self, run_id: str, *, timeout: float | None = None) -> Run:
        """The run once it is over (completed, failed or cancelled)."""
        for event in self.watch_events(run_id, 1 << 30, timeout=timeout):
            if isinstance(event, Run) and event.done:
                break
        run = self.get_run(run_id)
        if not run.done:
            raise AgentrunError(f"run {run_id} is still {run.status}", grpc.StatusCode.UNKNOWN)
        return run

    def start_and_wait(
        self, agent: str, input: str, *, timeout: float | None = None, **start: Any
    ) -> Run:
        """start_run, then the run once it is over (its output, or its error)."""
        run = self.start_run(agent, input, **start)
        return self.wait(run.run_id, timeout=timeout)

    # --- approvals ----------------------------------------------------------------------------

    def list_approvals(
        self, *, state: str | None = None, approver: str | None = None, page_size: int = 100
    ) -> Iterator[Approval]:
        """The workspace's approvals, newest first (`state`: pending, approved, ...)."""
        return self._pages(
            self._ops.list_approvals_page("", page_size, state, approver),
            lambda token: self._ops.list_approvals_page(token, page_size, state, approver),
        )

    def get_approval(self, approval_id: str) -> Approval:
        return self._do(self._ops.get_approval(approval_id))

    def approve(self, approval_id: str, *, arguments: Any = None, note: str = "") -> Approval:
        """Approve, as the caller's key; with `arguments`, run these instead (an edit)."""
        return self._do(self._ops.decide(approval_id, True, arguments=arguments, note=note))

    def deny(self, approval_id: str, reason: str = "") -> Approval:
        """Reject: the model gets "rejected: <reason>" as the call's result."""
        return self._do(self._ops.decide(approval_id, False, reason=reason))

    # --- sessions -----------------------------------------------------------------------------

    def create_session(
        self, agent: str, *, title: str = "", strategy: str | None = None
    ) -> Session:
        return self._do(self._ops.create_session(agent, title, strategy))

    def send_message(
        self,
        session_id: str,
        text: str,
        *,
        request_id: str | None = None,
        strategy: str | None = None,
        priority: int = 0,
    ) -> Turn:
        """Send the user's message; the turn names the run that answers it (wait for it with
        `wait(turn.run_id)`)."""
        return self._do(self._ops.send_message(session_id, text, request_id, strategy, priority))
