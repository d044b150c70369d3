"""Exporting a verified kernel into the user's model: a package with a `torch.library` op and a drop-in module,
and a Hugging Face `kernels` build (package.py at export time, runtime.py inside what it writes)."""

from .package import Exported, ExportError, export, variant

__all__ = ["ExportError", "Exported", "export", "variant"]
