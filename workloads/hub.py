"""How hbench calls the Hugging Face `datasets` library: quietly, and failing fast.

`workloads.corpus` turns every failure of ``datasets`` into one `HbenchError`
line, so the library's own log lines ("Failed to read schema from ...",
"Retrying in 1s [Retry 1/5]") are noise printed before that line; `quiet`
silences its loggers for the duration of a call.

A hub id is the one input that needs the network (hbench itself never does).
Without a network ``datasets`` retries five times over half a minute before
it gives up; `check_reachable` makes one connection attempt to the hub with a
short timeout first, and honours ``HF_HUB_OFFLINE`` / ``HF_DATASETS_OFFLINE``
by refusing at once.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
from urllib.parse import urlsplit

from common.errors import HbenchError

#: The loggers of the libraries a corpus read goes through.
LIBRARY_LOGGERS = ("datasets", "huggingface_hub", "fsspec")
#: Seconds the one connection attempt to the hub may take.
CONNECT_TIMEOUT_S = 3.0
_OFFLINE_VARS = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")


@contextlib.contextmanager
def quiet():
    """Silence the corpus libraries' loggers inside the block (restored after)."""
    saved = [(logging.getLogger(name), logging.getLogger(name).level) for name in LIBRARY_LOGGERS]
    for logger, _ in saved:
        logger.setLevel(logging.CRITICAL + 1)
    try:
        yield
    finally:
        for logger, level in saved:
            logger.setLevel(level)


def hub_endpoint() -> str:
    """The hub's base URL (``HF_ENDPOINT``, else huggingface.co)."""
    return os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")


def check_reachable(name: str) -> None:
    """Refuse, in one line and within `CONNECT_TIMEOUT_S`, to load hub dataset
    ``name`` when the environment says offline or the hub does not answer."""
    for var in _OFFLINE_VARS:
        if os.environ.get(var, "").strip().lower() in ("1", "true", "yes", "on"):
            raise HbenchError(f"hub dataset {name!r} needs network access, but {var} is set; "
                              "give a local file or folder with --dataset")
    endpoint = hub_endpoint()
    parts = urlsplit(endpoint)
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        raise HbenchError(f"HF_ENDPOINT {endpoint!r} is not a URL") from None
    if not parts.hostname:
        raise HbenchError(f"HF_ENDPOINT {endpoint!r} is not a URL")
    try:
        with socket.create_connection((parts.hostname, port), timeout=CONNECT_TIMEOUT_S):
            pass
    except OSError as exc:
        raise HbenchError(f"cannot load hub dataset {name!r}: the hub at {endpoint} does not "
                          f"answer ({exc.strerror or type(exc).__name__}); a hub id needs "
                          "network access, a local file or folder does not") from None
