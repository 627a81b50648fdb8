"""The text of sampled tokens the journal holds as ids only.

Capture keeps a token's text only when the server sent no ids (ids are what ART trains on,
and vLLM's ``--return-tokens-as-token-ids`` sends ids only), so a trainable turn's tokens are
ids. The viewer turns them back into text with the model's tokenizer: the one given with
``--tokenizer``, else the newest one a run folder holds (the CPU backend saves one with each
checkpoint, ``.art/<project>/models/<name>/checkpoints/<step>/``), else the runs' model when
it is a local folder or in the Hugging Face cache. Nothing is downloaded.

transformers (and the torch it imports: seconds, hundreds of MiB) loads only when a tokenizer
is asked for or found, on a thread of its own, never while a page waits.
"""

from __future__ import annotations

import functools
import logging
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .._errors import ConfigurationError

_log = logging.getLogger("arttrace")

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
"""A folder holding one of these is a tokenizer folder (as ``save_pretrained`` writes it)."""
_ALSO_TOKENIZER = ("tokenizer.model", "vocab.json")
"""Files of tokenizers saved without those (sentencepiece, GPT-2's BPE)."""
MAX_FOLDERS = 5_000
"""Folders looked at in one run folder (its journal aside) when looking for a tokenizer."""
CACHED_IDS = 262_144
"""Token texts kept per tokenizer (a token id's text never changes)."""
_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")
_DOWNLOAD = "hf download {} --include '*.json' '*.txt' '*.model'"


class TokenizerError(ConfigurationError):
    """A tokenizer that cannot be loaded; the message says why and what to do, in one line."""


@dataclass(frozen=True, slots=True)
class Found:
    """Where a tokenizer is: what ``from_pretrained`` loads, and how the page names it."""

    source: str
    """The folder it is in (a model in the Hugging Face cache: its snapshot there)."""
    name: str
    """How the page names it: as given, the model's name, or its folder relative to the run
    folder it was found in."""
    origin: str
    """Why this one: ``--tokenizer``, ``run folder``, ``model, local folder`` or ``model, HF
    cache``."""


class Decoder:
    """A loaded tokenizer: each token id's text (``decode([id])``, special tokens kept), kept
    in an LRU cache. Safe from several threads."""

    def __init__(self, tokenizer: Any, found: Found, size: int) -> None:
        self.tokenizer = tokenizer
        self.found = found
        self.size = size
        self._text = functools.lru_cache(maxsize=CACHED_IDS)(self._decode)

    def _decode(self, token_id: int) -> str | None:
        if not 0 <= token_id < self.size:  # not this tokenizer's: the page shows the id
            return None
        try:
            return str(self.tokenizer.decode([token_id], skip_special_tokens=False))
        except Exception:  # a tokenizer that cannot decode one id: the page shows the id
            return None

    def texts(self, ids: Iterable[int]) -> list[str | None]:
        """Each id's text (``None``: an id this tokenizer does not have)."""
        return [self._text(int(i)) for i in ids]

    def describe(self) -> dict[str, str]:
        return {"name": self.found.name, "source": self.found.source, "origin": self.found.origin}


def load(found: Found) -> Decoder:
    """The folder's ``tokenizer.json`` read by the ``tokenizers`` library (0.7 s and about
    160 MiB for Qwen2.5's, the same text per id), else
    ``AutoTokenizer.from_pretrained(found.source, local_files_only=True)`` (it imports torch:
    8 s and 700 MiB more); a :class:`TokenizerError` saying what to do when it cannot load."""
    fast = Path(found.source) / "tokenizer.json"
    if fast.is_file():
        try:
            from tokenizers import Tokenizer

            tokenizer = Tokenizer.from_file(str(fast))
            return Decoder(tokenizer, found, tokenizer.get_vocab_size(with_added_tokens=True))
        except Exception:  # an older format, a missing library: transformers reads it all
            pass
    try:
        from transformers import AutoTokenizer
    except ImportError as error:
        raise TokenizerError(
            f"the tokenizer {found.name} needs transformers ({error}): "
            "pip install 'arttrace[cpu]' (or pip install transformers)"
        ) from None
    try:
        tokenizer = AutoTokenizer.from_pretrained(found.source, local_files_only=True)
    except Exception as error:
        reason = " ".join(str(error).split())[:300]
        raise TokenizerError(
            f"the tokenizer {found.name} ({found.source}) cannot be loaded "
            f"({type(error).__name__}: {reason}): give a folder a model's tokenizer was saved "
            "in (save_pretrained), or a model name in the Hugging Face cache"
        ) from error
    return Decoder(tokenizer, found, len(tokenizer))


def load_given(name_or_path: str | os.PathLike[str]) -> Decoder:
    """The tokenizer ``--tokenizer`` names: a folder, or a model in the Hugging Face cache."""
    given = str(name_or_path)
    folder, wrong = locate(given)
    if folder is None:
        raise TokenizerError(wrong)
    return load(Found(str(folder), given, "--tokenizer"))


def problem(given: str) -> str | None:
    """Why ``--tokenizer given`` cannot be a tokenizer, found without loading transformers (a
    typo is told at once, not after seconds of imports); ``None`` when it may be one."""
    return locate(given)[1] or None


def locate(given: str) -> tuple[Path | None, str]:
    """The folder ``given`` (a folder, or a model name in the Hugging Face cache) has its
    tokenizer in, or ``None`` and why not (in ``--tokenizer``'s words)."""
    path = Path(given).expanduser()
    if path.is_dir():
        if _holds_tokenizer(path):
            return path, ""
        return None, (
            f"--tokenizer {given}: the folder holds no tokenizer (no tokenizer.json or "
            "tokenizer_config.json): give the folder a model's tokenizer was saved in"
        )
    if path.exists():
        return None, (
            f"--tokenizer {given}: a file, not a folder: give the folder that holds it "
            f"({path.parent})"
        )
    if not _REPO_ID.match(given):
        return None, (
            f"--tokenizer {given}: no such folder: give the folder a model's tokenizer was "
            "saved in (it holds tokenizer.json), or a model name in the Hugging Face cache"
        )
    cached = cached_folder(given)
    if cached is None:
        return None, (
            f"--tokenizer {given}: not a folder here, and not in the Hugging Face cache "
            f"({_cache_folder()}); the viewer never downloads: give a folder holding the "
            f"tokenizer, or fetch it once: {_DOWNLOAD.format(given)}"
        )
    return cached, ""


def _holds_tokenizer(folder: Path) -> bool:
    return any((folder / name).is_file() for name in TOKENIZER_FILES + _ALSO_TOKENIZER)


def cached_folder(model: str) -> Path | None:
    """The Hugging Face cache's folder of ``model``'s tokenizer (a model name), if the cache
    holds it (its latest snapshot there)."""
    if not _REPO_ID.match(model):
        return None
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return None
    for name in TOKENIZER_FILES:
        try:
            found = try_to_load_from_cache(model, name)
        except Exception:  # not a valid model name for the hub
            return None
        if isinstance(found, str):
            return Path(found).parent
    return None


def _cache_folder() -> str:
    try:
        from huggingface_hub import constants

        return str(constants.HF_HUB_CACHE)
    except ImportError:
        return "~/.cache/huggingface/hub"


def in_folder(root: Path) -> Path | None:
    """The newest tokenizer folder under the run folder ``root`` (the latest checkpoint: the
    highest step, then the newest file), its journal aside; ``None`` when there is none."""
    if not root.is_dir():
        return None
    best: tuple[int, int, str] | None = None
    found: Path | None = None
    seen = 0
    for folder, children, files in os.walk(root):
        seen += 1
        if seen > MAX_FOLDERS:
            break
        if folder == str(root):
            children[:] = [c for c in children if c != "journal"]
        children.sort()
        marker = next((n for n in TOKENIZER_FILES if n in files), None)
        if marker is None:
            continue
        name = os.path.basename(folder)
        try:
            modified = os.stat(os.path.join(folder, marker)).st_mtime_ns
        except OSError:
            continue
        key = (int(name) if name.isdigit() else -1, modified, folder)
        if best is None or key > best:
            best, found = key, Path(folder)
    return found


def discover(root: Path, models: Sequence[str]) -> Found | None:
    """The tokenizer for the run folder ``root`` whose calls named ``models``: the newest
    one the folder holds, else the first model that is a local tokenizer folder or in the
    Hugging Face cache."""
    folder = in_folder(root)
    if folder is not None:
        return Found(str(folder), str(folder.relative_to(root)), "run folder")
    for model in models:
        path = Path(model).expanduser()
        if path.is_absolute() and path.is_dir() and _holds_tokenizer(path):
            return Found(str(path), model, "model, local folder")
        cached = cached_folder(model)
        if cached is not None:
            return Found(str(cached), model, "model, HF cache")
    return None
