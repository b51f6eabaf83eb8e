"""What the supervisor asks of tritonserver, through its HTTP repository API."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Dict, List, Mapping, NamedTuple, Optional

# The parameter a reload's config carries, so that Triton takes it as a new config and loads a
# new copy of the model while the old one serves; the same config twice would be a no-op.
GENERATION_PARAMETER = "latte_generation"
LOAD_TIMEOUT_S = 600.0


class LoadOutcome(NamedTuple):
    ok: bool
    error: str  # Triton's words when not ok


class TritonRepository:
    def __init__(self, http_url: str, headers: Optional[Mapping[str, str]] = None) -> None:
        self.base = f"http://{http_url}"
        self.headers = dict(headers or {})

    def _call(self, path: str, body: Optional[dict] = None, timeout: float = 10.0) -> object:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(self.base + path, data=data, method="POST" if data is not None else "GET",
                                         headers={**self.headers, "Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=timeout) as response:
            raw = response.read()
        return json.loads(raw) if raw else None

    def index(self) -> List[dict]:
        return list(self._call("/v2/repository/index", {}) or [])

    def ready_models(self) -> List[str]:
        return sorted(entry["name"] for entry in self.index() if entry.get("state") == "READY")

    def config(self, model: str) -> Dict:
        return dict(self._call(f"/v2/models/{model}/config") or {})

    def reload(self, model: str, config: Mapping, generation: int) -> LoadOutcome:
        """Load `config` as a new copy of `model`: Triton keeps the current copy serving until
        the new one is ready, then swaps them (its config differs by GENERATION_PARAMETER)."""
        config = dict(config)
        parameters = dict(config.get("parameters") or {})
        parameters[GENERATION_PARAMETER] = {"string_value": str(generation)}
        config["parameters"] = parameters
        return self._load(model, {"parameters": {"config": json.dumps(config)}})

    def unload(self, model: str) -> LoadOutcome:
        return self._post(f"/v2/repository/models/{model}/unload", {})

    def _load(self, model: str, body: dict) -> LoadOutcome:
        return self._post(f"/v2/repository/models/{model}/load", body, timeout=LOAD_TIMEOUT_S)

    def _post(self, path: str, body: dict, timeout: float = 60.0) -> LoadOutcome:
        try:
            self._call(path, body, timeout=timeout)
            return LoadOutcome(True, "")
        except urllib.error.HTTPError as exc:
            try:
                text = json.loads(exc.read() or b"{}").get("error", "")
            except ValueError:
                text = ""
            # Triton's words may run over lines and end in ';': one line of them, for the log's one line an event.
            return LoadOutcome(False, " ".join(text.split()).rstrip("; ") or f"HTTP {exc.code}")
        except (urllib.error.URLError, OSError) as exc:
            return LoadOutcome(False, f"tritonserver did not answer: {exc}")
