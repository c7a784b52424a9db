"""One run's requests to the model: opening, the streamed steps and their tool calls, retries,
timeouts and cleanup.

Phases, as the run manager sees them:

- `open(before_start=True)` is the dispatch phase: it sends the request and returns once
  the server has answered with its headers. Failing to reach the server at all,
  a rejected key, an unknown model or a refused request raise `DispatchError`.
- The stream (`ReplyStream`) yields the reply's text. Before its first token a failed
  attempt may be retried; once text has been shown it never is.

With tools (TOOLS.md §13, an agent with `mcp_servers`), a run is a loop of steps, one
request each: a step that ends with tool calls has them carried out by the run's
`ToolHost`, and the next request sends the model its calls and their results. Text
of a later step is a new paragraph of the same reply. The loop ends when a step makes
no calls, or at a limit (stopReason `tool_limit`), without asking the model again. An HTTP
request's own function tools are offered beside the agent's: a step that calls one hands
those calls to the API client and ends the run (stopReason `tool_calls`, HTTP-API.md §14.4).

Every way a run stops early (abort, interrupt, steer, reset, delete, any timeout)
reaches this code as a cancellation or a timeout, and every one of them closes the
HTTP connection, so the model server stops generating instead of finishing a
reply nobody reads.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from typing import Any

import openai

from chat.base import agents as catalog
from chat.base import metering
from chat.runtime.backends.base import BackendError, BackendTimeout, DispatchError, RunContext
from chat.runtime.backends.openai import request_options
from chat.runtime.backends.openai.clients import client_for
from chat.runtime.backends.openai.conversation import PARAGRAPH, build_messages, steer_messages, step_messages
from chat.runtime.backends.openai.errors import Failure, classify
from chat.runtime.backends.openai.settings import AgentSettings, reasoning_effort
from chat.runtime.backends.openai.tool_calls import StreamedCalls
from chat.runtime.tools.host import ToolHost
from chat.runtime.tools.results import ToolServerError
from sessions_app.lifecycle.usage import CallUsage
from sessions_app.models import ToolCallState

log = logging.getLogger(__name__)

# Once the model has said why it stopped, only the usage chunk and [DONE] are still
# due; a server that then keeps the connection open must not turn a finished reply
# into an idle timeout.
AFTER_FINISH_GRACE_S = 2.0
RUN_ENDED_STATES = (ToolCallState.CANCELLED, ToolCallState.UNKNOWN)  # set only by the end of the call's run


class ModelRun:
    """One run's requests to the model: steps, attempts, retries, timeouts and cleanup."""

    def __init__(
        self,
        agent: catalog.Agent,
        settings: AgentSettings,
        api_key: str,
        ctx: RunContext,
        config: Mapping[str, Any],
        images: Mapping[str, str] | None = None,  # the run's images as data URLs, by file id
    ) -> None:
        agent_id = agent.id
        self.agent_id = agent_id
        self.settings = settings
        self.ctx = ctx
        # what the session chose, as the catalog rules it (an override the agent no longer lists is not used)
        self.model = catalog.session_model(agent, ctx.model)
        self.reasoning_effort = reasoning_effort(catalog.session_thinking(agent, ctx.thinking_level))
        self.loop = asyncio.get_running_loop()
        # The run manager's budget (timeoutMs) started just before dispatch.
        self.budget_deadline = self.loop.time() + ctx.timeout_ms / 1000
        self.retries_left = settings.max_retries
        self.attempt = 0
        self.attempt_started = 0.0
        self.messages = build_messages(ctx, settings, images)
        self.client = client_for(settings, api_key)
        self.response: openai.AsyncStream[Any] | None = None
        self.closed = False
        # tools (TOOLS.md §13): set by load_tools when the agent has MCP servers
        self.tools: ToolHost | None = None
        # the API client's function tools (HTTP-API.md §14.4): offered beside the agent's, never run here
        self.client_names = {tool.name for tool in ctx.request.client_tools}
        self.tool_defs: list[dict[str, Any]] = request_options.client_tool_defs(ctx.request)
        self.step = 1
        self.reply_len = 0  # characters of reply text yielded so far, in all steps
        self.reply: list[str] = []  # that text (a steer keeps it as a part of its own in the transcript)
        self.call_ids: set[str] = set()  # the model's call ids sent in this run (they must not repeat)
        # this attempt's output: text, tool calls, usage
        self.step_text: list[str] = []
        self.step_calls = StreamedCalls()
        self.attempt_usage: dict[str, int] = {}
        self.attempt_details: dict[str, int] = {}  # its cached and reasoning tokens
        self.usage_before: dict[str, int] = {}  # the usage of the steps already finished
        task = asyncio.current_task()
        if task is not None:
            # Backstop: whatever ends the run's task (even a cancellation between
            # dispatch and the first read, where nobody holds the stream), the
            # connection is closed.
            task.add_done_callback(self._task_done)

    # --- opening -------------------------------------------------------------------------------

    async def load_tools(self) -> None:
        """The agent's tools, listed during dispatch: a server that cannot start is a dispatch failure."""
        host = self.ctx.tools
        if host is None or not host.configured:
            return
        try:
            await host.load()
        except ToolServerError as exc:
            raise DispatchError(exc.message) from exc
        self.tools = host
        self.tool_defs = [*host.openai_tools(), *self.tool_defs]

    async def open(self, *, before_start: bool) -> None:
        """Send the request and wait for the response headers, retrying what may be retried."""
        while True:
            self.attempt += 1
            self.attempt_started = self.loop.time()
            try:
                async with asyncio.timeout(self.settings.first_token_timeout_ms / 1000):
                    self.response = await self.client.chat.completions.create(**self._request())
                return
            except TimeoutError:
                raise await self._first_token_timeout() from None
            except Exception as exc:  # SDK errors, and anything else sending the request can raise
                failure = classify(exc, self.agent_id, before_start=before_start)
                log.info("run %s attempt %s failed: %s", self.ctx.run_id, self.attempt, failure.error)
                await self._backoff_or_raise(failure)

    def _request(self) -> dict[str, Any]:
        s = self.settings
        request: dict[str, Any] = {"model": self.model, "messages": self.messages, "stream": True}
        if self.reasoning_effort is not None:
            request["reasoning_effort"] = self.reasoning_effort
        if self.tool_defs:
            request["tools"] = self.tool_defs
            choice = request_options.tool_choice(self.ctx.request, self.step)
            if choice is not None:
                request["tool_choice"] = choice
        if s.stream_usage:
            request["stream_options"] = {"include_usage": True}
        if s.temperature is not None:
            request["temperature"] = s.temperature
        asked = request_options.sampling(self.ctx.request, with_tools=bool(self.tool_defs))
        if s.max_tokens is not None and not any(cap in asked for cap in request_options.TOKEN_CAPS):
            request["max_tokens"] = s.max_tokens
        request.update(asked)  # the API client's own choices win over the agent's defaults
        if s.extra_body:
            request["extra_body"] = s.extra_body
        return request

    async def _backoff_or_raise(self, failure: Failure) -> None:
        """Sleep before the next attempt, or raise the failure when none is left or worth it."""
        if not failure.retryable or self.retries_left <= 0:
            raise failure.error
        used = self.settings.max_retries - self.retries_left
        delay = self.settings.retry_backoff_ms / 1000 * (2**used) * (1 + random.random() / 4)
        if failure.retry_after is not None:
            if failure.retry_after * 1000 > self.settings.max_retry_wait_ms:
                raise failure.error  # the server asks for longer than we are willing to hold the run
            delay = max(delay, failure.retry_after)
        if self.loop.time() + delay >= self.budget_deadline:
            raise failure.error  # waiting would only end in the run's own timeout
        self.retries_left -= 1
        await self._close_response()
        await asyncio.sleep(delay)

    # --- streaming ---------------------------------------------------------------------------------

    def stream(self) -> ReplyStream:
        return ReplyStream(self)

    async def chunks(self) -> AsyncGenerator[str, None]:
        """Yield the reply's text, step by step; retry a failed attempt only while its step showed nothing.

        Tool calls run only here, after their step's stream has finished, and a step is
        retried only before it produced any output, then never read again: a retried step
        starts its calls afresh from the new response, and no call of a step runs twice.
        """
        try:
            while True:
                shown = False
                while True:  # the attempts of this step
                    try:
                        async for text in self._read_attempt():
                            shown = True
                            yield text
                        break
                    except _AttemptFailed as failed:
                        if shown:
                            raise failed.failure.error from None
                        log.info("run %s attempt %s failed: %s", self.ctx.run_id, self.attempt, failed)
                        await self._backoff_or_raise(failed.failure)
                        await self.open(before_start=False)
                if not await self._next_step():
                    return
        except asyncio.CancelledError:
            await self._close_after_cancel()
            raise
        finally:
            await self.close()

    async def _next_step(self) -> bool:
        """Run the finished step's calls and open the next step's request; False when the reply is done.

        Calls of the API client's own tools are handed to it, after the agent's own calls of the step
        ran: the run then ends (stopReason `tool_calls`), and the client's next request brings their
        results (HTTP-API.md §14.4).
        """
        self.usage_before = add_usage(self.usage_before, self.attempt_usage)
        used = self._step_usage()
        calls = self.step_calls.finish(self.step, self.call_ids)
        handed = [c for c in calls if c.name in self.client_names]
        own = [c for c in calls if c.name not in self.client_names]
        if not handed and (not own or self.tools is None):
            self.ctx.calls.append(used)  # the run's last call: recorded with its end
            return False
        # whether the model is asked again after these tools (known now: the client's calls end the
        # run, so does the step limit); only then must a budget cover one more call
        tools = self.tools
        again = not handed and tools is not None and self.step < tools.config.max_steps and not tools.limit_reached
        if self.ctx.record_call is None:
            self.ctx.calls.append(used)
        elif await self.ctx.record_call(used, again):
            # a budget is spent or cannot take the next call (or the run's own cap is reached): no
            # tool starts, the model is not asked again
            self.ctx.stop_reason = "budget"
            return False
        await self._close_response()  # read to its end: the connection goes back to the pool
        results = (
            await self.tools.run_calls(
                self.step, own, reply_offset=self.reply_len, reply_text="".join(self.reply), steerable=True
            )
            if own and self.tools
            else []
        )
        if any(r.status in RUN_ENDED_STATES for r in results):
            # Only a run's end gives a call these states (an abort while the call waited
            # for approval returns here before the run's task is cancelled): the run is
            # over, and the model is not asked again.
            raise asyncio.CancelledError()
        if handed:
            if self.ctx.tools is None:
                raise BackendError("the agent's tool settings are not valid", kind="backend")
            await self.ctx.tools.hand_to_client(self.step, handed, reply_offset=self.reply_len)
            self.ctx.stop_reason = "tool_calls"
            return False
        self.messages.extend(step_messages("".join(self.step_text), own, results))
        assert self.tools is not None
        if self.step >= self.tools.config.max_steps or self.tools.limit_reached:
            self.ctx.stop_reason = "tool_limit"  # the model is not asked again
            return False
        # the steering messages that came during the step, after its calls' results (the last call's
        # end is a boundary too): the next request is the first to see them
        await self.tools.steering.take(self.step, "".join(self.reply))
        self.messages.extend(steer_messages(self.tools.steering.drain(), self.settings))
        self.step += 1
        self.retries_left = self.settings.max_retries  # the retry rules apply per request
        await self.open(before_start=False)
        return True

    def _step_usage(self) -> CallUsage:
        """The finished step's model call: the usage its (last) attempt reported, or its text's estimate."""
        report = {**self.attempt_usage, **self.attempt_details} if self.attempt_usage else None
        prompt = json.dumps(self.messages, default=str)
        return metering.call_usage(
            self.ctx.agent, self.model, self.step, report, prompt_text=prompt, output_text="".join(self.step_text)
        )

    async def _read_attempt(self) -> AsyncIterator[str]:
        """Read one response; the first-token and idle timers run only while waiting on it."""
        response = self.response
        assert response is not None
        first = True
        deadline = self.attempt_started + self.settings.first_token_timeout_ms / 1000
        finished = False
        self.step_text, self.step_calls, self.attempt_usage, self.attempt_details = [], StreamedCalls(), {}, {}
        while True:
            chunk = await self._next_chunk(response, deadline, first=first, finished=finished)
            if chunk is None:
                break
            self._take_usage(chunk)
            produced = False
            for choice in chunk.choices or []:
                out, alive, ended = self._take_choice(choice)
                produced = produced or alive
                finished = finished or ended
                if out:
                    first = False
                    yield out
            if finished:
                deadline = self.loop.time() + min(AFTER_FINISH_GRACE_S, self.settings.idle_timeout_ms / 1000)
            elif produced:
                first = False  # thinking tokens count as tokens for the timers
                deadline = self.loop.time() + self.settings.idle_timeout_ms / 1000
        if not finished:
            cut = BackendError("the model server closed the stream before the reply was finished")
            raise _AttemptFailed(Failure(cut, retryable=True))

    async def _next_chunk(
        self, response: openai.AsyncStream[Any], deadline: float, *, first: bool, finished: bool
    ) -> Any:
        """The response's next chunk, or None at its end (or when only a late usage chunk is missing)."""
        try:
            # The timer covers the network wait only, never the consumer's work
            # between chunks (no `yield` inside the timeout block).
            async with asyncio.timeout_at(deadline):
                return await response.__anext__()
        except StopAsyncIteration:
            return None
        except TimeoutError:
            if finished:
                return None  # the reply is complete; only a late usage chunk was missing
            raise (await self._first_token_timeout() if first else await self._idle_timeout()) from None
        except openai.OpenAIError as exc:
            raise _AttemptFailed(classify(exc, self.agent_id, before_start=False)) from exc
        except Exception as exc:  # a malformed event (bad JSON) is not worth a retry
            log.warning("run %s: bad event from the model server: %r", self.ctx.run_id, exc)
            raise BackendError("the model server sent a malformed stream event") from exc

    def _take_usage(self, chunk: Any) -> None:
        usage = getattr(chunk, "usage", None)
        if usage is not None:
            counts = {"prompt_tokens": usage.prompt_tokens, "completion_tokens": usage.completion_tokens}
            self.attempt_usage = {k: int(v) for k, v in counts.items() if isinstance(v, int)}
            cached = getattr(getattr(usage, "prompt_tokens_details", None), "cached_tokens", None)
            reasoning = getattr(getattr(usage, "completion_tokens_details", None), "reasoning_tokens", None)
            details = {"cached_tokens": cached, "reasoning_tokens": reasoning}
            self.attempt_details = {k: int(v) for k, v in details.items() if isinstance(v, int)}
            self.ctx.usage = add_usage(self.usage_before, self.attempt_usage) or None

    def _take_choice(self, choice: Any) -> tuple[str, bool, bool]:
        """One choice of a chunk: the reply text to show ("" for none), whether the model
        produced anything (text, thinking or a tool call's piece), and whether it finished."""
        delta = choice.delta
        text = (delta.content or "") if delta is not None else ""
        refusal = getattr(delta, "refusal", None) if delta is not None else None
        if refusal:
            text += refusal  # a refusal is the model's answer, shown as such
        # Reasoning models stream their thinking in a side field first: it is
        # not part of the reply but proves the model is alive.
        thinking = _reasoning(delta)
        fragments = (getattr(delta, "tool_calls", None) or []) if delta is not None else []
        for fragment in fragments:
            self.step_calls.add(fragment)
        produced = bool(text or thinking or fragments)
        finished = bool(choice.finish_reason)
        if finished:
            self.ctx.stop_reason = str(choice.finish_reason)
        if self.step > 1 and not self.step_text:
            text = text.lstrip()  # the paragraph break below separates the steps
        if not text:
            return "", produced, finished
        out = (PARAGRAPH if self.step > 1 and not self.step_text and self.reply_len else "") + text
        self.step_text.append(text)
        self.reply_len += len(out)
        self.reply.append(out)
        return out, produced, finished

    # --- timeouts and cleanup -----------------------------------------------------------------------

    async def _first_token_timeout(self) -> BackendTimeout:
        ms = self.settings.first_token_timeout_ms
        await self._close_and_record(self.attempt_started + ms / 1000)
        return BackendTimeout(f"no first token from the model within {ms} ms (first_token_timeout_ms)")

    async def _idle_timeout(self) -> BackendTimeout:
        ms = self.settings.idle_timeout_ms
        await self._close_and_record(self.loop.time())
        return BackendTimeout(f"the model sent nothing for {ms} ms after its last token (idle_timeout_ms)")

    async def _close_after_cancel(self) -> None:
        """A cancellation: the run manager records an abort's cost itself; a budget timeout it does not."""
        if self.loop.time() >= self.budget_deadline - 0.05:
            await self._close_and_record(self.budget_deadline)
        else:
            await self.close()

    async def _close_and_record(self, since: float) -> None:
        """Close the connection and report how long stopping took (stored as Run.cancel_ms)."""
        await self.close()
        self.ctx.cancel_ms = max(0, int((self.loop.time() - since) * 1000))

    async def _close_response(self) -> None:
        response, self.response = self.response, None
        if response is not None:
            with contextlib.suppress(Exception):
                await response.close()

    async def close(self) -> None:
        """Close the response (idempotent).

        Closing a response whose body was not read to the end closes its connection
        (it is not returned to the pool), which is what tells the server to stop.
        """
        if self.closed:
            return
        self.closed = True
        await self._close_response()

    def _task_done(self, _task: asyncio.Task[Any]) -> None:
        if self.closed or self.loop.is_closed():
            return
        with contextlib.suppress(RuntimeError):
            cleanup = self.loop.create_task(self.close())
            _CLEANUPS.add(cleanup)
            cleanup.add_done_callback(_CLEANUPS.discard)


_CLEANUPS: set[asyncio.Task[None]] = set()


def add_usage(a: dict[str, int], b: dict[str, int]) -> dict[str, int]:
    return {k: a.get(k, 0) + b.get(k, 0) for k in (*a, *(k for k in b if k not in a))}


def _reasoning(delta: Any) -> bool:
    """True when the delta carries reasoning text (vLLM/DeepSeek `reasoning_content`, Ollama `reasoning`)."""
    if delta is None:
        return False
    extra = getattr(delta, "model_extra", None) or {}
    return bool(extra.get("reasoning_content") or extra.get("reasoning"))


class _AttemptFailed(Exception):
    """An attempt failed in a way that may be retried if nothing was shown yet."""

    def __init__(self, failure: Failure) -> None:
        super().__init__(str(failure.error))
        self.failure = failure


class ReplyStream:
    """The text stream handed to the run manager.

    A plain async generator would not do: `aclose()` on one that never started
    skips its cleanup, and the manager closes an unstarted stream when an abort
    wins the race to mark the run running.
    """

    def __init__(self, run: ModelRun) -> None:
        self._run = run
        self._chunks = run.chunks()

    def __aiter__(self) -> ReplyStream:
        return self

    async def __anext__(self) -> str:
        return await self._chunks.__anext__()

    async def aclose(self) -> None:
        try:
            await self._chunks.aclose()
        finally:
            await self._run.close()
