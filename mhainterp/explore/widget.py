"""The notebook view: an anywidget running the page's own ES module, no server needed.

The module (``assets/explorer.js``) sends ``{id, action, body}`` messages; the widget answers
each with :func:`~mhainterp.explore.app.answer_message` (``{id, status, body}``), exactly what
the HTTP server answers. Needs ``anywidget`` (``pip install "mhainterp[explore]"``).
An ``exact`` or ``verify`` message (a forward a newer click stops:
:data:`~mhainterp.explore.exact.CANCELLABLE`) is answered from a thread of its own, so the
next click's message is heard meanwhile and stops it, as on the server.

Example:
    >>> ExplorerWidget(Explorer.from_path("runs/rev/runs/h4_seed0"))  # doctest: +SKIP
"""

from __future__ import annotations

import contextvars
import threading
from pathlib import Path
from typing import Any

import anywidget

from mhainterp.explore.app import Explorer, answer_message
from mhainterp.explore.exact import CANCELLABLE

__all__ = ["ExplorerWidget"]

ASSET_DIR = Path(__file__).parent / "assets"


class ExplorerWidget(anywidget.AnyWidget):
    """The explorer as a Jupyter widget (see the module docstring).

    Attributes:
        explorer: The :class:`Explorer` it shows; ``widget.explorer.session`` is the
            :class:`~mhainterp.explore.session.ExploreSession`, for reading the numbers from code.
    """

    _esm = ASSET_DIR / "explorer.js"
    _css = ASSET_DIR / "explorer.css"

    def __init__(self, explorer: Explorer, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.explorer = explorer
        self.on_msg(self._on_message)

    def _on_message(self, widget: Any, content: Any, buffers: Any) -> None:
        if isinstance(content, dict) and content.get("action") in CANCELLABLE:
            context = contextvars.copy_context()  # the command's device and threads
            answer = self._answer_in_thread
            threading.Thread(target=context.run, args=(answer, content), daemon=True).start()
            return
        self.send(answer_message(self.explorer, content))

    def _answer_in_thread(self, content: Any) -> None:
        self.send(answer_message(self.explorer, content))
