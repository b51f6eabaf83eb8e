"""Triton's administrative APIs behind a header, as Triton's "Secure Deployment Considerations"
ask: anyone who reaches the server may infer, read health, metadata, configs and statistics;
only a caller who sends the header with the right value may register shared memory, change
the log settings (including where the log file is written), change tracing or use the model
repository's index and load/unload calls.

`latte serve` off loopback and the manifests of `latte deploy k8s` both restrict these, with
the same flags, built here.
"""

from __future__ import annotations

import ipaddress
import secrets
from typing import List

# What the header guards: system and CUDA shared-memory registration, the model repository
# (index, load, unload), the log settings and tracing. Triton's names for them.
ADMIN_APIS = ("shared-memory", "model-repository", "logging", "trace")
ADMIN_HEADER = "latte-admin-key"
# Over gRPC Triton looks for the header under this prefixed name (metadata keys of a gRPC call).
GRPC_ADMIN_HEADER = f"triton-grpc-protocol-{ADMIN_HEADER}"


def restricted_api_args(value: str, header: str = ADMIN_HEADER) -> List[str]:
    """tritonserver's flags that refuse ADMIN_APIS, over HTTP and gRPC, unless a request carries
    `header: value`. `value` may be a Kubernetes `$(VARIABLE)`, expanded by the kubelet."""
    if not value or any(c in value for c in " ,:="):
        raise ValueError("the access token must be non-empty, without spaces, commas, colons or '='")
    apis = ",".join(ADMIN_APIS)
    return [f"--http-restricted-api={apis}:{header}={value}",
            f"--grpc-restricted-protocol={apis}:{header}={value}"]


def new_access_token() -> str:
    """A random token for the header, URL-safe (it goes into a command line and a header)."""
    return secrets.token_hex(24)


def is_loopback(address: str) -> bool:
    """Whether only this machine can reach `address` (127.0.0.0/8, ::1, localhost)."""
    if address == "localhost":
        return True
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False
