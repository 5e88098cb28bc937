"""The one stub SGLang's memory modules need on torch's CPU build.

``import sglang.srt.mem_cache.memory_pool`` imports ``sglang.srt.configs``
(every model's config class), and two multimodal configs there
(``configs/nano_nemotron_vl.py`` via ``multimodal/internvl_utils.py:5`` and
``configs/deepseek_ocr.py:7``) import ``torchvision.transforms`` at module
level. PyPI's torchvision wheel is built against CUDA torch and fails to
load against the CPU build (``operator torchvision::nms does not exist``),
so it is not installed. `install` puts a module in its place whose every
attribute is an inert placeholder: the image transforms are only called when
an image model preprocesses an image, which never happens here. Nothing
else is stubbed; everything else SGLang imports is the real package
(scripts/setup_sglang_cpu.sh lists them).

transformers decides once whether torchvision is available; `install`
asks it before the placeholder exists, so transformers keeps its true
answer (no) and never routes an import through the placeholder.

``python -m adapters.sglang_cpu.stubs --check`` imports SGLang's memory
modules with the stub in place and prints the versions (the setup script's
last step).
"""

from __future__ import annotations

import importlib.machinery
import sys
import types

STUBBED = ("torchvision", "torchvision.transforms", "torchvision.transforms.functional")


class _Inert:
    """Stands for any torchvision object; constructing or calling it does nothing."""

    def __init__(self, *args, **kwargs):
        pass

    def __call__(self, *args, **kwargs):
        return _Inert()

    def __getattr__(self, name):
        return _Inert()


class _InertModule(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Inert


def install() -> None:
    """Put the torchvision placeholder in ``sys.modules`` (idempotent; a real
    torchvision that imports is left alone)."""
    if "torchvision" in sys.modules:
        return
    try:
        import torchvision  # noqa: F401  (a working real one wins)
        return
    except Exception:       # absent, or the CUDA-linked wheel failing to load
        sys.modules.pop("torchvision", None)
    from transformers.utils import import_utils
    import_utils.is_torchvision_available()     # cache the true answer first
    for name in STUBBED:
        module = _InertModule(name)
        module.__path__ = []
        module.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=True)
        sys.modules[name] = module
    sys.modules["torchvision"].transforms = sys.modules["torchvision.transforms"]
    sys.modules["torchvision.transforms"].functional = sys.modules[
        "torchvision.transforms.functional"]


def check() -> str:
    """Import SGLang's memory modules with the stub installed; their versions."""
    install()
    import sglang
    import sglang.srt.mem_cache.memory_pool  # noqa: F401
    import sglang.srt.mem_cache.unified_radix_cache  # noqa: F401
    import torch
    return f"sglang {sglang.__version__} memory modules import on torch {torch.__version__}"


if __name__ == "__main__":
    print(check())
