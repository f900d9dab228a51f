"""The model-API proxy: replay any agent whose model base URL can be set, with no code change.

A loopback HTTP server speaking OpenAI Chat Completions (``/v1/chat/completions``), OpenAI
Responses (``/v1/responses``) and Anthropic Messages (``/v1/messages``), plain and streamed. For
each trial's attempt (``ModelProxy.open_trial``) it meters every call against the trial's budget
from the provider's full usage, records every exchange in the cassette (``cache.ResponseCache``)
keyed by trial identity so ``replay`` mode re-runs offline, applies the perturbations that live
on the wire (``sampling``, ``decoy_tools``, ``model_fault``, ``tool_result_fault``), emits a
GenAI span per call, and hands back what it witnessed (``ModelProxy.close_trial`` →
``ProxyEvidence``).

    proxy = ModelProxy(cache=ResponseCache(path, "record"), tracer_provider=provider)
    proxy.start()
    route = proxy.open_trial(trial, budget)
    run_agent(env={**os.environ, **route.env()})
    evidence = proxy.close_trial(route)
    proxy.stop()
"""

from plumbline_otel.replay.proxy.evidence import ProxyEvidence
from plumbline_otel.replay.proxy.server import ModelProxy, ProxyRoute

__all__ = ["ModelProxy", "ProxyEvidence", "ProxyRoute"]
