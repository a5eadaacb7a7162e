"""`mlx_lm.server` (0.32.2) on a free loopback port for the span of a
`with` block, for the checks that compare `archgen serve` with it.

    with mlx_lm_server(model_dir) as base:
        post(base, "/v1/chat/completions", {...})
"""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import sys
import time
import urllib.request

TIMEOUT_S = 120
START_TIMEOUT_S = 300


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(base: str, path: str, body: dict) -> dict:
    request = urllib.request.Request(
        base + path, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:
        return json.loads(response.read())


def post_stream(base: str, path: str, body: dict) -> list[dict]:
    """The server-sent events of a streamed request, as JSON objects."""
    request = urllib.request.Request(
        base + path, data=json.dumps({**body, "stream": True}).encode(),
        headers={"Content-Type": "application/json"},
    )
    events = []
    with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:
        for raw in response:
            line = raw.decode().strip()
            if line.startswith("data: ") and line != "data: [DONE]":
                events.append(json.loads(line[len("data: "):]))
    return events


def wait_ready(base: str, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"mlx_lm.server exited ({proc.returncode})")
        try:
            with urllib.request.urlopen(base + "/v1/models", timeout=5):
                return
        except OSError:
            time.sleep(0.5)
    raise SystemExit(f"mlx_lm.server did not answer within {START_TIMEOUT_S} s")


@contextlib.contextmanager
def mlx_lm_server(model: str):
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "mlx_lm.server", "--model", model, "--host", "127.0.0.1",
         "--port", str(port)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        wait_ready(base, proc)
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
