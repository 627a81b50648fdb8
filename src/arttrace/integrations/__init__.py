"""Framework integrations, one module per framework, each importable only with its extra.

:func:`arttrace.instrument` hooks every framework that is installed, as soon as the
application imports it: ``langchain`` (LangChain and LangGraph), ``llama_index``,
``google_adk``, ``openai_agents`` (the OpenAI Agents SDK) and ``dspy`` (which only notes
answers from DSPy's cache: its calls are recorded below it). Each module also offers its hook
for explicit use. Every integration module has ``install()`` and ``uninstall()`` (idempotent),
which this package calls.
"""
