"""The structure a newcomer reads is the structure the code has: the layering drawn in
CONTRIBUTING.md and docs/architecture.md is the one `lint-imports` enforces (pyproject.toml),
every package has its place in it, and the tests mirror the packages and share only
``tests/support``."""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "arttrace"


def contract_layers() -> list[str]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    (layers,) = (c["layers"] for c in config["contracts"] if c["type"] == "layers")
    return [" | ".join(sorted(part.strip() for part in layer.split("|"))) for layer in layers]


def drawn_layers(page: str) -> list[str]:
    """The layers of the first text block in ``page``: each line's names before the notes."""
    block = re.search(r"```text\n(.*?)```", (ROOT / page).read_text(), re.S)
    assert block, f"{page} has no ```text block with the layering"
    layers = []
    for line in block.group(1).splitlines():
        names = re.match(r"\s*([\w]+(?:\s*\|\s*[\w]+)*)", line)
        if names and not line.startswith("  " * 10):  # a continuation line holds only notes
            layers.append(" | ".join(sorted(n.strip() for n in names.group(1).split("|"))))
    return layers


def test_the_drawn_layering_is_the_enforced_one():
    enforced = contract_layers()
    for page in ("CONTRIBUTING.md", "docs/architecture.md"):
        assert drawn_layers(page) == enforced, page


def test_every_package_and_top_level_module_has_a_layer():
    placed = {name for layer in contract_layers() for name in layer.split(" | ")}
    present = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()} | {
        p.stem for p in PACKAGE.glob("*.py") if p.name != "__init__.py"
    }
    assert present == placed


def test_the_test_folders_mirror_the_packages_and_share_only_support():
    tests = ROOT / "tests"
    folders = {p.name for p in tests.iterdir() if p.is_dir() and not p.name.startswith((".", "_"))}
    packages = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()}
    assert folders - {"support"} <= packages
    modules = {p.stem for p in tests.rglob("test_*.py")} | {"conftest"}
    for path in tests.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                imported = {node.module.split(".")[0]}
            elif isinstance(node, ast.Import):
                imported = {alias.name.split(".")[0] for alias in node.names}
            else:
                continue
            assert not imported & modules, f"{path.relative_to(ROOT)} imports a test module"
