"""The public surface: ``__all__`` of every public module and docs/reference.md name the same
things; every other name is private; deprecated spellings still work, and warn."""

from __future__ import annotations

import ast
import re
import warnings
from pathlib import Path

import pytest

import arttrace as at

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src" / "arttrace"


def _public_modules() -> dict[str, list[str]]:
    """Every module of arttrace whose dotted name has no private part and that declares an
    ``__all__``, with it (read from the source: nothing is imported)."""
    found: dict[str, list[str]] = {}
    for path in sorted(SRC.rglob("*.py")):
        parts = path.relative_to(SRC.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        if any(p.startswith("_") for p in parts):
            continue
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
            ):
                found[".".join(parts)] = list(ast.literal_eval(node.value))
    return found


def _documented() -> set[str]:
    reference = (ROOT / "docs" / "reference.md").read_text()
    return set(re.findall(r"^::: (arttrace\.\S+)", reference, re.MULTILINE))


def test_all_and_the_reference_name_the_same_things() -> None:
    modules = _public_modules()
    documented = _documented()
    assert "arttrace.integrations.llama_index" in modules and "arttrace.store" in modules
    # A subpackage's name re-exported by arttrace is documented once, as arttrace.<name>.
    missing = [
        f"{module}.{name}"
        for module, names in modules.items()
        for name in names
        if f"{module}.{name}" not in documented
        and not (name in modules["arttrace"] and f"arttrace.{name}" in documented)
    ]
    assert missing == [], "add these to docs/reference.md (or make them private)"
    unexported = [
        entry
        for entry in documented
        if entry.rpartition(".")[2] not in modules.get(entry.rpartition(".")[0], [])
    ]
    assert unexported == [], "docs/reference.md documents names missing from their __all__"


def test_every_name_in_all_exists() -> None:
    assert sorted(set(at.__all__) - set(dir(at))) == []
    for name in at.__all__:
        getattr(at, name)


@pytest.mark.parametrize(
    ("module", "old", "new"),
    [
        ("arttrace.rewards", "GroupReward", at.GroupRewardFn),
        ("arttrace.rewards", "Group", at.Group),
        ("arttrace.rewards", "GroupRewards", at.GroupRewards),
        ("arttrace.rewards", "GroupRun", at.GroupRun),
    ],
)
def test_deprecated_names_still_work_and_warn(module: str, old: str, new: object) -> None:
    package = __import__(module, fromlist=[old])
    with pytest.warns(DeprecationWarning, match=rf"{module}\.{old} is deprecated.*: use arttrace"):
        assert getattr(package, old) is new
    assert old not in package.__all__


def test_private_names_are_gone() -> None:
    """Names that were public by accident: no deprecation, nothing could take them."""
    from arttrace import store, translation

    for module, name in [
        (at, "Settings"),
        (store, "ORDERS"),
        (store, "SCHEMA_VERSION"),
        (store, "fts5_available"),
        (translation, "open_translation"),
        (translation, "apis"),
    ]:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert not hasattr(module, name), f"{module.__name__}.{name}"
