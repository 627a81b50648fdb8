"""Capture: what the agent's LLM calls were, exactly, and which run they belong to.

``@trainable`` (``_trainable``) marks the policy; ``trajectory()`` (``_trajectory``) scopes a run;
the OpenAI shim (``_openai``, ``_chat``) and the framework hooks (:mod:`arttrace.integrations`)
record calls as :class:`~arttrace.LLMCall` records (``_records``) through one call lifecycle
(``_calls``); a call seen by two layers is kept once (``_layers``). Nothing here imports ART or
torch: conversion to ART's types (``capture._art``) loads on first use.
"""
