"""Serving a model over HTTP with dynamic batching: `bertkit serve MODEL`, or `serve(...)`.

The web part (`bertkit.serve.app`) needs the `bertkit[serve]` extra (FastAPI, uvicorn, orjson);
the engine (`ServedModel`: what each endpoint computes) and the batcher (`DynamicBatcher`) do
not.
"""

from __future__ import annotations

import os

from bertkit.errors import InputError
from bertkit.serve.batcher import DynamicBatcher, QueueFull
from bertkit.serve.config import ServeConfig
from bertkit.serve.engine import ServedModel

__all__ = ["DynamicBatcher", "InputError", "QueueFull", "ServeConfig", "ServedModel",
           "serve"]  # fmt: skip


def serve(model: str | os.PathLike, config: ServeConfig | None = None, *,
          access_log: bool = False) -> None:  # fmt: skip
    """Load `model`, warm it, and serve it until SIGTERM or Ctrl-C (see bertkit.serve.app)."""
    try:
        from bertkit.serve import app
    except ImportError as err:
        raise ImportError(
            f"bertkit serve needs its extra ({err.name} is missing): pip install 'bertkit[serve]'"
        ) from None
    app.serve(model, config, access_log=access_log)
