"""The `openai` backend: streaming chat completions from any OpenAI-compatible server.

Works with OpenAI itself and with the local servers that speak its API (Ollama,
vLLM, llama.cpp's server, LM Studio). Configuration, timeouts, retries and error
mapping are described in docs/agents.md.

By seam: settings (an agent's configuration, validated once), conversation (the
messages sent to the model), tool_calls (the model's calls put together from their
streamed pieces), request_options (an HTTP request's client tools, tool_choice and
sampling parameters), errors (SDK failures as the run's errors), clients (the SDK clients
reused across runs), stream (one run's requests, steps, retries, timeouts and
cleanup) and backend (the `AgentBackend` itself).
"""

from chat.runtime.backends.openai.backend import OpenAIBackend

__all__ = ["OpenAIBackend"]
