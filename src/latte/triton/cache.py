"""Triton's response cache: its size, the server flag that turns it on, and which models use it.

A model's `response_cache { enable: true }` only takes effect when tritonserver was started
with a cache (`--cache-config local,size=BYTES`); without one Triton loads the model and
never caches. So a server on a repository whose models ask for the cache gets one by default.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import List, Optional

# Big enough for tens of thousands of small responses; the cache evicts the least recently used.
DEFAULT_CACHE_BYTES = 256 * 1024 * 1024
_UNITS = {"": 1, "k": 1000, "m": 1000 ** 2, "g": 1000 ** 3, "ki": 1024, "mi": 1024 ** 2, "gi": 1024 ** 3}
_SIZE = re.compile(r"^([0-9]+)\s*([kmg]i?)?b?$", re.IGNORECASE)


class CacheSizeError(ValueError):
    """A cache size that is not a whole number of bytes (with an optional unit)."""


def parse_size(text: str) -> int:
    """'268435456', '256Mi', '1Gi', '500M' -> bytes; 0 turns the cache off."""
    match = _SIZE.match(str(text).strip())
    if not match:
        raise CacheSizeError(f"cache size {text!r}: expected bytes, optionally with a unit (Ki, Mi, Gi, K, M, G), "
                             "e.g. 256Mi")
    return int(match.group(1)) * _UNITS[(match.group(2) or "").lower()]


def cache_flag(size_bytes: int) -> str:
    """tritonserver's flag for a local (in-process, LRU) cache of size_bytes."""
    return f"--cache-config=local,size={size_bytes}"


def cache_directory_flags(server: Path) -> List[str]:
    """Where tritonserver finds caches/local/libtritoncache_local.so: next to its bin/ in both
    /opt/tritonserver and the nvidia-pytriton wheel, but it only looks in /opt/tritonserver/caches."""
    caches = Path(server).resolve().parent.parent / "caches"
    return [f"--cache-directory={caches}"] if (caches / "local").is_dir() else []


def models_with_response_cache(repo: Path) -> List[str]:
    """Models of REPO whose config enables the response cache (configs that do not parse are skipped:
    the server reports those itself)."""
    from latte.generator.validate import InvalidConfig, parse_config

    names = []
    for path in sorted(Path(repo).glob("*/config.pbtxt")):
        try:
            config = parse_config(path.read_text(), str(path))
        except (InvalidConfig, OSError):
            continue
        if config.response_cache.enable:
            names.append(config.name)
    return names


def cache_bytes(requested: Optional[int], a_model_enables_it: bool) -> int:
    """The cache a server gets: `requested` when given, else the default when a model asks for one."""
    if requested is not None:
        return requested
    return DEFAULT_CACHE_BYTES if a_model_enables_it else 0


def cache_bytes_for(repo: Path, requested: Optional[int]) -> int:
    return cache_bytes(requested, bool(requested is None and models_with_response_cache(repo)))
