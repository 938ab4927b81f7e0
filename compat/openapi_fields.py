"""Request fields every embedding route reads the same way (compat/wire/inputs.py), declared once for the
/openapi.json schemas of every route family."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from engine.types import ModelInfo

LATE_CHUNKING: dict[str, Any] = {
    "type": ["boolean", "null"],
    "description": "our extension (Jina's late chunking): the inputs are consecutive chunks of one document, joined "
                   "as given and embedded in one pass, one vector per chunk (docs/routes.md, \"Late chunking\")"}
TRUNCATION_DIRECTION: dict[str, Any] = {
    "anyOf": [{"enum": ["right", "left", "Right", "Left"]}, {"type": "null"}],
    "description": "with truncation, which end of an over-long input is cut: right (default) or left (TEI's field)"}


def task_field(infos: list[ModelInfo]) -> dict[str, Any]:
    """`task` (compat/wire/inputs.py parse_task): the task adapters every model the route may pick has; null
    only when none has adapters (a task is refused then); any string when no model is known yet."""
    tasks = [{name for name, _ in info.tasks} for info in infos]
    if not infos or (any(tasks) and not all(tasks)):
        schema: dict[str, Any] = {"type": ["string", "null"]}
    elif not any(tasks):
        schema = {"type": "null"}
    else:
        schema = {"enum": [None, *sorted(set.intersection(*tasks))]}
    return {**schema, "description": "our extension: the task adapter the inputs run with (jina-embeddings-v3; "
                                     "/props `tasks`), its instruction put before each text when no prompt_name "
                                     "is given; null: prompt_name's task, else the model's default_task"}
