"""The endpoint `latte serve` owns beside tritonserver's: readiness and liveness that tell the
truth about every model, the supervisor's metrics, and a way to ask for a rejuvenation.

    GET  /ready                     200 when every model serves; 503 naming each one that does not, and why
    GET  /live                      200 unless the supervisor is stuck or a model was given up
    GET  /metrics                   latte_model_restarts_total{model,reason}, latte_models_down, ...
    POST /models/NAME/rejuvenate    reload NAME with no failed request (the admin key, where one is set)
"""

from __future__ import annotations

import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Optional

from latte.supervision.supervisor import DOWN, REASONS, SERVING, STUCK_AFTER_S, Snapshot, Supervisor
from latte.triton.security import ADMIN_HEADER

_REJUVENATE = re.compile(r"^/models/([^/]+)/rejuvenate/?$")


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def metrics_text(snapshot: Snapshot) -> str:
    lines = ["# HELP latte_model_restarts_total Model restarts by the supervisor, by reason "
             "(died, hung, rejuvenated, gave_up)",
             "# TYPE latte_model_restarts_total counter"]
    for model in sorted(snapshot.models):
        for reason in REASONS:
            lines.append(f'latte_model_restarts_total{{model="{_label(model)}",reason="{reason}"}} '
                         f"{snapshot.restarts.get((model, reason), 0)}")
    down = sum(1 for v in snapshot.models.values() if v.status != SERVING)
    lines += ["# HELP latte_models_down Models down or restarting now",
              "# TYPE latte_models_down gauge", f"latte_models_down {down}",
              "# HELP latte_model_ready 1 while the model serves",
              "# TYPE latte_model_ready gauge"]
    lines += [f'latte_model_ready{{model="{_label(m)}"}} {int(v.status == SERVING)}'
              for m, v in sorted(snapshot.models.items())]
    lines += ["# HELP latte_model_given_up 1 once the model used up its restarts and stays down",
              "# TYPE latte_model_given_up gauge"]
    lines += [f'latte_model_given_up{{model="{_label(m)}"}} {int(v.status == DOWN)}'
              for m, v in sorted(snapshot.models.items())]
    lines += ["# HELP latte_server_restarts_total tritonserver started again by latte serve after it exited",
              "# TYPE latte_server_restarts_total counter", f"latte_server_restarts_total {snapshot.server_restarts}"]
    lines += ["# HELP latte_supervisor_step_age_seconds Seconds since the supervisor's last step",
              "# TYPE latte_supervisor_step_age_seconds gauge",
              f"latte_supervisor_step_age_seconds {snapshot.last_step_age_s:.3f}"]
    return "\n".join(lines) + "\n"


def readiness(snapshot: Snapshot) -> dict:
    not_serving = {m: {"status": v.status, "reason": v.reason, "since": v.since}
                   for m, v in sorted(snapshot.models.items()) if v.status != SERVING}
    body = {"ready": snapshot.ready, "models": len(snapshot.models), "not_serving": not_serving}
    if not snapshot.server_alive:
        body["server"] = "tritonserver is not running"
    return body


def liveness(snapshot: Snapshot) -> dict:
    why = []
    if not snapshot.server_alive:
        why.append("tritonserver is not running")
    if snapshot.last_step_age_s >= STUCK_AFTER_S:
        why.append(f"the supervisor's last step was {snapshot.last_step_age_s:.0f} s ago")
    why += [f"model '{m}' {v.reason}" for m, v in sorted(snapshot.models.items()) if v.status == DOWN]
    return {"live": snapshot.live, "why": why}


class HealthEndpoint:
    def __init__(self, supervisor: Supervisor, address: str, port: int, admin_token: Optional[str] = None) -> None:
        self.supervisor = supervisor
        self.admin_token = admin_token
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:  # probes every few seconds would flood the log
                pass

            def _send(self, code: int, body: str, kind: str = "application/json") -> None:
                data = body.encode()
                self.send_response(code)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                snapshot = endpoint.supervisor.snapshot()
                path = self.path.split("?", 1)[0].rstrip("/")
                if path == "/ready":
                    self._send(200 if snapshot.ready else 503, json.dumps(readiness(snapshot)))
                elif path == "/live":
                    self._send(200 if snapshot.live else 503, json.dumps(liveness(snapshot)))
                elif path == "/metrics":
                    self._send(200, metrics_text(snapshot), "text/plain; version=0.0.4")
                else:
                    self._send(404, json.dumps({"error": f"no such path {path!r}; try /ready, /live or /metrics"}))

            def do_POST(self) -> None:
                match = _REJUVENATE.match(self.path.split("?", 1)[0])
                if match is None:
                    self._send(404, json.dumps({"error": "POST /models/NAME/rejuvenate is the only action"}))
                elif endpoint.admin_token and self.headers.get(ADMIN_HEADER) != endpoint.admin_token:
                    self._send(403, json.dumps({"error": f"this action needs the header {ADMIN_HEADER}"}))
                elif not endpoint.supervisor.rejuvenate(match.group(1), "asked for through the endpoint"):
                    self._send(404, json.dumps({"error": f"model '{match.group(1)}' is not supervised"}))
                else:
                    self._send(202, json.dumps({"rejuvenating": match.group(1)}))

        self._server = ThreadingHTTPServer((address, port), Handler)
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, name="latte-health", daemon=True)

    def start(self) -> "HealthEndpoint":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
