"""The explorer's HTTP server: the page, its two assets and JSON endpoints (Starlette, uvicorn).

Routes (nothing else exists, so no path can reach a file outside the package's assets)::

    GET  /                    the page (assets/index.html)
    GET  /assets/{name}       explorer.js or explorer.css, looked up by exact name
    GET  /api/state           Explorer.handle("state")
    POST /api/{action}        Explorer.handle(action, json body); 400 {"error": ...} if bad

Every JSON answer is valid JSON (a NaN or infinity becomes ``null``). While the model loads
(:class:`ExplorerLoader`), the page and its assets are served and ``/api/*`` answers
503 ``{"loading": ...}``; the page polls until it is ready.

Hardening (the server is local, but a web page in the same browser can send it requests):

- **Host**: a request whose ``Host`` names anything but this machine's loopback names
  (``localhost``, ``127.0.0.1``, ``[::1]``) or the bound address is refused with 400, so a page
  cannot reach the server through DNS rebinding. Any port is accepted (``ssh -L`` forwards).
- **Origin**: a POST that carries an ``Origin`` other than the server's own
  (``http://`` + its ``Host``) is refused with 403. A browser sends ``Origin`` on every
  cross-origin POST; a client without one (curl, a script) is not a web page and is let in.
- **Body size**: a body over :data:`MAX_BODY_BYTES` is refused with 413 before it is read
  (``Content-Length``) or as soon as the bytes counted while streaming pass the limit
  (chunked), so it is never buffered whole.
- **JSON**: a body that is not a JSON object (malformed, not UTF-8, nested too deeply to
  parse) is 400, never 500.

Example:
    >>> app = build_app(Explorer.from_path("runs/quickstart/reverse"))  # doctest: +SKIP
    >>> serve(app, host="127.0.0.1", port=8765)  # doctest: +SKIP
"""

from __future__ import annotations

import contextvars
import json
import socket
import threading
import time
from collections.abc import Callable
from contextlib import suppress
from importlib import resources
from typing import Any

from mhainterp.errors import BadRequestError, PortInUseError
from mhainterp.explore.exact import CANCELLABLE
from mhainterp.explore.wire import json_ready

__all__ = [
    "ASSETS",
    "LOCAL_HOSTS",
    "MAX_BODY_BYTES",
    "ExplorerLoader",
    "ServerThread",
    "allowed_hosts",
    "asset_bytes",
    "bind",
    "build_app",
    "host_name",
    "json_bytes",
]

ASSETS = {
    "explorer.js": "text/javascript; charset=utf-8",
    "explorer.css": "text/css; charset=utf-8",
}
"""The only files served (besides index.html), by exact name."""

LOCAL_HOSTS = ("localhost", "127.0.0.1", "::1")
"""Host names always accepted: this machine's loopback names."""

MAX_BODY_BYTES = 64 * 1024
"""Largest request body accepted (the biggest real one, ``{"run": ...}``, is under 1 KiB)."""

_WILDCARDS = ("0.0.0.0", "::", "")


def asset_bytes(name: str) -> bytes:
    """The packaged asset ``name`` (``index.html`` or a key of :data:`ASSETS`)."""
    return resources.files("mhainterp.explore").joinpath("assets", name).read_bytes()


# ----------------------------------------------------------------------------- JSON, hosts


def json_bytes(value: Any) -> bytes:
    """``value`` as strict JSON: NaN and infinities become ``null`` (JSON has neither).

    Example:
        >>> json_bytes({"a": float("nan"), "b": [1.5, float("inf")]})
        b'{"a":null,"b":[1.5,null]}'
    """
    try:
        text = json.dumps(value, allow_nan=False, separators=(",", ":"))
    except ValueError:  # a non-finite float somewhere: the slow, careful path
        text = json.dumps(json_ready(value), allow_nan=False, separators=(",", ":"))
    return text.encode()


def host_name(header: str) -> str:
    """The host of a ``Host`` header, lower case, without port or IPv6 brackets.

    Example:
        >>> host_name("LocalHost:8765"), host_name("[::1]:80"), host_name("127.0.0.1")
        ('localhost', '::1', '127.0.0.1')
    """
    header = header.strip().lower()
    if header.startswith("["):  # [v6]:port
        return header[1 : header.find("]")] if "]" in header else header
    name, _, port = header.rpartition(":")
    return name if name and port.isdigit() else header


def allowed_hosts(bound: str) -> frozenset[str]:
    """Host names the server answers when it listens on ``bound``.

    The loopback names, ``bound`` itself and, for a wildcard address (``0.0.0.0``, ``::``:
    the user asked to be reachable from the network), this machine's names and addresses.
    """
    names = {*LOCAL_HOSTS, bound.strip("[]").lower()}
    if bound in _WILDCARDS:
        hostname = socket.gethostname()
        names |= {hostname.lower(), socket.getfqdn().lower()}
        with suppress(OSError):  # a name that does not resolve: its names only
            names |= set(socket.gethostbyname_ex(hostname)[2])
    return frozenset(names - {""})


class ExplorerLoader:
    """The explorer being built in a background thread, so the page shows while it loads.
    The thread runs in the context it was made in: the command's ``--device`` and
    ``--threads`` (:func:`mhainterp.runtime.device_context`) reach the model it loads.

    Args:
        build: Builds the explorer (loads the model, runs the clean forward).
        what: What is loading, for the page (``"h8_seed0"``).

    Attributes:
        explorer: The explorer once built, else None.
        error: The exception that ended the build, else None.
    """

    def __init__(self, build: Callable[[], Any], what: str = "the model") -> None:
        self.what = what
        self.explorer: Any = None
        self.error: BaseException | None = None
        self._done = threading.Event()
        context = contextvars.copy_context()  # a new thread starts with an empty one
        self._thread = threading.Thread(target=context.run, args=(self._run, build), daemon=True)

    def start(self) -> ExplorerLoader:
        """Start building; returns self."""
        self._thread.start()
        return self

    def _run(self, build: Callable[[], Any]) -> None:
        try:
            self.explorer = build()
        except BaseException as error:  # handed to whoever waits (the CLI prints one line)
            self.error = error
        finally:
            self._done.set()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the build ends (or ``timeout`` seconds); True when it has ended."""
        return self._done.wait(timeout)


# ----------------------------------------------------------------------------- the app


def build_app(explorer: Any, host: str = "127.0.0.1") -> Any:
    """The Starlette app serving ``explorer`` (an ``Explorer`` or an :class:`ExplorerLoader`).

    Args:
        explorer: What to serve.
        host: The address the server listens on (its name is accepted in ``Host``).

    The explorer serialises requests itself (:meth:`~mhainterp.explore.app.Explorer.handle`:
    a session is a mutable state and torch runs one forward at a time on these models
    anyway). The work a newer click cancels (``exact``, ``verify``:
    :data:`~mhainterp.explore.exact.CANCELLABLE`) is answered in a worker thread, so that click
    can arrive meanwhile and stop it; the rest is answered where it arrives, as before.
    """
    from starlette.applications import Starlette
    from starlette.concurrency import run_in_threadpool
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Route

    pages = {name: asset_bytes(name) for name in ("index.html", *ASSETS)}
    no_cache = {"Cache-Control": "no-store"}
    hosts = allowed_hosts(host)
    loader = explorer if isinstance(explorer, ExplorerLoader) else None

    def reply(value: Any, status: int = 200) -> Response:
        return Response(json_bytes(value), status, media_type="application/json", headers=no_cache)

    async def index(request: Request) -> Response:
        html = pages["index.html"]
        return Response(html, media_type="text/html; charset=utf-8", headers=no_cache)

    async def asset(request: Request) -> Response:
        name = request.path_params["name"]
        if name not in ASSETS:
            return Response("not found", status_code=404, media_type="text/plain")
        return Response(pages[name], media_type=ASSETS[name], headers=no_cache)

    def answer(action: str, body: Any) -> Response:
        target = explorer if loader is None else loader.explorer
        if target is None:
            if loader is not None and loader.error is not None:
                return reply({"error": f"cannot load {loader.what}: {loader.error}"}, 500)
            return reply({"loading": f"loading {loader.what}…"}, 503)
        try:
            result = target.handle(action, body)
        except BadRequestError as error:
            return reply({"error": str(error)}, 400)
        return reply(result)

    async def get_state(request: Request) -> Response:
        return answer("state", {})

    async def post_action(request: Request) -> Response:
        origin = request.headers.get("origin")
        if origin is not None and origin.lower() != f"http://{request.headers['host'].lower()}":
            return reply({"error": f"Origin {origin!r} is not this page's: refused"}, 403)
        raw = await _read_body(request)
        if raw is None:
            return reply({"error": f"the request body is over {MAX_BODY_BYTES} bytes"}, 413)
        body = _parse_object(raw)
        if isinstance(body, str):
            return reply({"error": body}, 400)
        action = request.path_params["action"]
        if action in CANCELLABLE:
            return await run_in_threadpool(answer, action, body)
        return answer(action, body)

    routes = [
        Route("/", index, methods=["GET"]),
        Route("/assets/{name}", asset, methods=["GET"]),
        Route("/api/state", get_state, methods=["GET"]),
        Route("/api/{action}", post_action, methods=["POST"]),
    ]
    return _HostGuard(Starlette(routes=routes), hosts)


async def _read_body(request: Any) -> bytes | None:
    """The body, or None as soon as it is known to exceed :data:`MAX_BODY_BYTES`."""
    declared = request.headers.get("content-length", "")
    if declared.strip().isdigit() and int(declared) > MAX_BODY_BYTES:
        return None  # refused unread
    chunks, size = [], 0
    async for chunk in request.stream():  # chunked bodies: counted while they arrive
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            return None
        chunks.append(chunk)
    return b"".join(chunks)


def _parse_object(raw: bytes) -> dict[str, Any] | str:
    """The JSON object in ``raw`` (empty: ``{}``), or the message saying why it is not one."""
    if not raw.strip():
        return {}
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError):  # RecursionError: nested too deeply to parse
        return "the request body is not JSON"
    if not isinstance(body, dict):
        return f"the request body must be a JSON object, not {type(body).__name__}"
    return body


class _HostGuard:
    """ASGI middleware: 400 for a request whose ``Host`` is not one of ``hosts``."""

    def __init__(self, app: Any, hosts: frozenset[str]) -> None:
        self.app, self.hosts = app, hosts

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            headers = dict(scope.get("headers") or [])
            host = headers.get(b"host", b"").decode("latin-1")
            if host_name(host) not in self.hosts:
                message = f"Host {host!r} is not this machine: use http://127.0.0.1:<port>/"
                await _send_json(send, 400, {"error": message})
                return
        await self.app(scope, receive, send)


async def _send_json(send: Any, status: int, value: Any) -> None:
    body = json_bytes(value)
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


# ----------------------------------------------------------------------------- sockets


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
    """Run the app in a background thread (the CLI, notebooks, tests, the benchmark), in the
    context it was made in (the command's ``--device`` and ``--threads`` reach every request).

    Args:
        app: The app (:func:`build_app`).
        host: Address to listen on.
        port: Port (0: a free one).
        sock: A socket already bound by :func:`bind` (then ``host``/``port`` are its own).

    Example:
        >>> with ServerThread(build_app(explorer)) as server:  # doctest: +SKIP
        ...     print(server.url)
    """

    def __init__(
        self, app: Any, host: str = "127.0.0.1", port: int = 0, sock: socket.socket | None = None
    ) -> None:
        import uvicorn

        self.sock = sock if sock is not None else bind(host, port)
        self.host, self.port = host, self.sock.getsockname()[1]
        shown = f"[{host}]" if ":" in host else host
        self.url = f"http://{shown}:{self.port}/"
        config = uvicorn.Config(app, log_level="warning", lifespan="off")
        self.server = uvicorn.Server(config)
        self._finished = threading.Event()
        context = contextvars.copy_context()  # a new thread starts with an empty one
        self.thread = threading.Thread(target=context.run, args=(self._serve,), daemon=True)

    def _serve(self) -> None:
        try:
            self.server.run(sockets=[self.sock])
        finally:
            self._finished.set()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the server has stopped (or ``timeout`` seconds); True once it has.

        Use this, not ``thread.join``/``is_alive``: on Python < 3.13 a Ctrl-C that lands inside
        ``join`` can mark a thread that still runs as stopped (CPython gh-90882), and the
        shutdown then closed the socket under uvicorn, whose own close raised in its thread
        (``ValueError: Invalid file descriptor: -1``, a traceback after "stopped" in CI).
        """
        return self._finished.wait(timeout)

    def __enter__(self) -> ServerThread:
        self.thread.start()
        while not self.server.started and not self._finished.is_set():
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.should_exit = True
        # uvicorn's shutdown closes the socket itself; closing it first, while the server may
        # still stop serving it, is what raised. A server that has not stopped in 10 s is a
        # daemon thread: it ends with the process, and the socket with it.
        if self.wait(timeout=10):
            self.sock.close()
