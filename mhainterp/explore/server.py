"""The explorer's HTTP server: the page, its two assets and JSON endpoints (Starlette, uvicorn).

Routes (nothing else exists, so no path can reach a file outside the package's assets)::

    GET  /                    the page (assets/index.html)
    GET  /assets/{name}       explorer.js or explorer.css, looked up by exact name
    GET  /api/state           Explorer.handle("state")
    POST /api/{action}        Explorer.handle(action, json body); 400 {"error": ...} if bad

Example:
    >>> app = build_app(Explorer.from_path("runs/quickstart/reverse"))  # doctest: +SKIP
    >>> serve(app, host="127.0.0.1", port=8765)  # doctest: +SKIP
"""

from __future__ import annotations

import json
import socket
import threading
from importlib import resources
from typing import Any

from mhainterp.explore.app import BadRequestError, Explorer

__all__ = ["ASSETS", "PortInUseError", "ServerThread", "asset_bytes", "bind", "build_app"]

ASSETS = {
    "explorer.js": "text/javascript; charset=utf-8",
    "explorer.css": "text/css; charset=utf-8",
}
"""The only files served (besides index.html), by exact name."""


class PortInUseError(OSError):
    """The port is taken; the message suggests ``--port``."""


def asset_bytes(name: str) -> bytes:
    """The packaged asset ``name`` (``index.html`` or a key of :data:`ASSETS`)."""
    return resources.files("mhainterp.explore").joinpath("assets", name).read_bytes()


def build_app(explorer: Explorer) -> Any:
    """The Starlette app serving ``explorer``.

    One lock serialises requests: a session is a mutable state and torch runs one forward at a
    time on these models anyway.
    """
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response
    from starlette.routing import Route

    lock = threading.Lock()
    pages = {name: asset_bytes(name) for name in ("index.html", *ASSETS)}
    no_cache = {"Cache-Control": "no-store"}

    async def index(request: Request) -> Response:
        html = pages["index.html"]
        return Response(html, media_type="text/html; charset=utf-8", headers=no_cache)

    async def asset(request: Request) -> Response:
        name = request.path_params["name"]
        if name not in ASSETS:
            return Response("not found", status_code=404, media_type="text/plain")
        return Response(pages[name], media_type=ASSETS[name], headers=no_cache)

    def answer(action: str, body: Any) -> Response:
        try:
            with lock:
                result = explorer.handle(action, body)
        except BadRequestError as error:
            return JSONResponse({"error": str(error)}, status_code=400)
        return JSONResponse(result)

    async def get_state(request: Request) -> Response:
        return answer("state", {})

    async def post_action(request: Request) -> Response:
        raw = await request.body()
        try:
            body = json.loads(raw) if raw else {}
        except ValueError:
            return JSONResponse({"error": "the request body is not JSON"}, status_code=400)
        return answer(request.path_params["action"], body)

    routes = [
        Route("/", index, methods=["GET"]),
        Route("/assets/{name}", asset, methods=["GET"]),
        Route("/api/state", get_state, methods=["GET"]),
        Route("/api/{action}", post_action, methods=["POST"]),
    ]
    return Starlette(routes=routes)


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on ``host:port``.

    Raises:
        PortInUseError: when the port is taken (message names it and suggests ``--port``).
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.bind((host, port))
    except OSError as error:
        sock.close()
        raise PortInUseError(
            f"cannot listen on {host}:{port} ({error.strerror or error}); "
            "choose another port with --port"
        ) from None
    # Accepted sockets inherit this: without it, Nagle's algorithm and the client's delayed ACK
    # hold every response for ~40 ms (measured: 44 ms -> 0.3 ms per request).
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.listen(128)
    sock.setblocking(False)
    return sock


class ServerThread:
    """Run the app in a background thread (notebooks, tests, the benchmark).

    Example:
        >>> with ServerThread(build_app(explorer)) as server:  # doctest: +SKIP
        ...     print(server.url)
    """

    def __init__(self, app: Any, host: str = "127.0.0.1", port: int = 0) -> None:
        import uvicorn

        self.sock = bind(host, port)
        self.host, self.port = host, self.sock.getsockname()[1]
        self.url = f"http://{host}:{self.port}/"
        config = uvicorn.Config(app, log_level="warning", lifespan="off")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True
        )

    def __enter__(self) -> ServerThread:
        import time

        self.thread.start()
        while not self.server.started and self.thread.is_alive():
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
        self.sock.close()
