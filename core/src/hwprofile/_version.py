"""hwprofile's version: a leaf (imports nothing), so a module that records it never imports the package's face."""

from __future__ import annotations

__version__ = "0.1.0"
