"""A griffe extension for the API reference: arttrace's docstrings use reST roles
(``:class:`arttrace.Trajectory```) and literal-block markers (a line ending in ``::``), which
Markdown would show verbatim. Each role becomes inline code and each ``::`` a colon (the
indented block after it is already a Markdown code block), so the rendered reference reads
like the rest of the site."""

from __future__ import annotations

import re
from typing import Any

import griffe

_ROLE = re.compile(r":(?:class|func|meth|attr|data|mod|exc|obj):`~?([^`]+)`")
_LITERAL = re.compile(r"(?<=\S)::$", re.M)


class RestRoles(griffe.Extension):
    def on_object(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            text = _ROLE.sub(r"`\1`", obj.docstring.value)
            obj.docstring.value = _LITERAL.sub(":", text)
