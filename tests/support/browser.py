"""A real headless Chromium for the viewer's tests: Debian's ``/usr/bin/chromium`` driven by
Playwright (never a browser Playwright downloads), in a fresh profile each time.

``ARTTRACE_SCREENSHOTS=docs/images pytest tests/viewer/test_viewer.py`` also writes the pages' PNGs
where the docs show them (by default they go to the test's temporary folder only).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

CHROMIUM = Path(os.environ.get("ARTTRACE_CHROMIUM", "/usr/bin/chromium"))
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
VIEWPORT = {"width": 1360, "height": 900}


@contextmanager
def chromium() -> Iterator[object]:
    """A browser context (``playwright.sync_api.BrowserContext``) on a fresh user-data-dir,
    removed afterwards."""
    if not CHROMIUM.exists():
        pytest.fail(
            f"no Chromium at {CHROMIUM}: `make test` installs Debian's (apt-get install "
            "chromium), or point ARTTRACE_CHROMIUM at one"
        )
    from playwright.sync_api import sync_playwright

    profile = tempfile.mkdtemp(prefix="arttrace-chromium-")
    try:
        with sync_playwright() as playwright:
            context = playwright.chromium.launch_persistent_context(
                profile,
                executable_path=str(CHROMIUM),
                headless=True,
                args=ARGS,
                viewport=VIEWPORT,  # type: ignore[arg-type]
                device_scale_factor=1,
            )
            try:
                yield context
            finally:
                context.close()
    finally:
        shutil.rmtree(profile, ignore_errors=True)


class Screenshots:
    """Saves each page's PNG in ``folder`` (and in ``$ARTTRACE_SCREENSHOTS`` when set)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        extra = os.environ.get("ARTTRACE_SCREENSHOTS")
        self.extra = Path(extra) if extra else None
        self.taken: list[Path] = []

    def take(self, page: object, name: str, *, full_page: bool = True) -> Path:
        path = self.folder / f"{name}.png"
        page.screenshot(path=str(path), full_page=full_page)  # type: ignore[attr-defined]
        self.taken.append(path)
        if self.extra is not None:
            self.extra.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, self.extra / path.name)
        return path
