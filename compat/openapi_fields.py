"""Request fields every embedding route reads the same way (compat/wire/inputs.py), declared once for the
/openapi.json schemas of every route family."""
from __future__ import annotations

from typing import Any

LATE_CHUNKING: dict[str, Any] = {
    "type": ["boolean", "null"],
    "description": "our extension (Jina's late chunking): the inputs are consecutive chunks of one document, joined "
                   "as given and embedded in one pass, one vector per chunk (docs/routes.md, \"Late chunking\")"}
TRUNCATION_DIRECTION: dict[str, Any] = {
    "anyOf": [{"enum": ["right", "left", "Right", "Left"]}, {"type": "null"}],
    "description": "with truncation, which end of an over-long input is cut: right (default) or left (TEI's field)"}
