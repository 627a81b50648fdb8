"""Tokenizers, below every other part: finding a model's tokenizer on this machine (``_find``:
the viewer, the continuity check and the CPU server look it up the same way) and the chat
templates the test and CPU servers render with (``_chat``)."""
