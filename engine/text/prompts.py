"""Prompts. Rerankers: the checkpoint's own Jinja template when it ships one, else ours from templates/.
Embedding models: sentence-transformers' named prompts and the instruction templates model cards define."""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from engine.checkpoint import Checkpoint
from engine.errors import InvalidInput, UnsupportedCheckpoint
from engine.resources import data_folder
from engine.types import ModelInfo

# The model card's default task for Qwen3-Reranker.
DEFAULT_INSTRUCTION = "Given a web search query, retrieve relevant passages that answer the query"

# Where a checkpoint ships its reranker prompt (Qwen3-VL-Reranker does; plain Qwen3-Reranker does not).
CHECKPOINT_TEMPLATE = Path("additional_chat_templates") / "reranker.jinja"

_QUERY_MARK, _DOCUMENT_MARK = "\ue000query\ue000", "\ue000document\ue000"


def templates_dir() -> Path:
    """Our templates: the installed data package, or templates/ beside engine/ in a source checkout."""
    return data_folder("engine.templates", "templates")


@dataclass(frozen=True)
class PromptPart:
    kind: str  # "text" | "query" | "document"
    text: str = ""


class RerankPrompt:
    """Renders one (query, document) prompt; also splits it into scaffold and content for truncation."""

    def __init__(self, checkpoint: Checkpoint, fallback: str):
        own = checkpoint.path / CHECKPOINT_TEMPLATE
        path = own if own.is_file() else templates_dir() / fallback
        if not path.is_file():
            raise UnsupportedCheckpoint(f"{checkpoint.path}: no reranker template (looked for {own} and {path})")
        from jinja2 import TemplateError  # only a reranker with a template loads jinja2
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        env = ImmutableSandboxedEnvironment(keep_trailing_newline=True, autoescape=False)
        try:
            self._template = env.from_string(path.read_text(encoding="utf-8"))
        except TemplateError as exc:
            raise UnsupportedCheckpoint(f"{path}: invalid Jinja template: {exc}") from exc
        self.source = path
        probe = self.render(_QUERY_MARK, _DOCUMENT_MARK, DEFAULT_INSTRUCTION)
        if probe.count(_QUERY_MARK) != 1 or probe.count(_DOCUMENT_MARK) != 1:
            raise UnsupportedCheckpoint(f"{path}: the template must place the query and the document once each")

    def render(self, query: str, document: str, instruction: str | None = None) -> str:
        return self._template.render(query=query, document=document,
                                     instruction=instruction or DEFAULT_INSTRUCTION)

    def parts(self, instruction: str | None = None) -> list[PromptPart]:
        """The prompt as scaffold text and content slots, in order."""
        text = self.render(_QUERY_MARK, _DOCUMENT_MARK, instruction)
        out: list[PromptPart] = []
        while text:
            q, d = text.find(_QUERY_MARK), text.find(_DOCUMENT_MARK)
            hits = [(i, mark) for i, mark in ((q, _QUERY_MARK), (d, _DOCUMENT_MARK)) if i >= 0]
            if not hits:
                out.append(PromptPart("text", text))
                break
            at, mark = min(hits)
            if at:
                out.append(PromptPart("text", text[:at]))
            out.append(PromptPart("query" if mark == _QUERY_MARK else "document"))
            text = text[at + len(mark):]
        return out


# Embedding families whose model card defines how a task instruction wraps a query, keyed by model_type.
# Qwen3-Embedding's card: get_detailed_instruct(task, query) = f'Instruct: {task}\nQuery:{query}' (no space).
INSTRUCTION_TEMPLATES = {
    "qwen3": "Instruct: {task}\nQuery:{text}",
}


def default_prompt_name(checkpoint: Checkpoint, chosen: str | None) -> str | None:
    """--default-prompt-name if given (it must name one of the checkpoint's prompts), else the checkpoint's."""
    if chosen is None:
        return checkpoint.default_prompt_name
    if chosen not in checkpoint.prompts:
        known = ", ".join(sorted(checkpoint.prompts)) or "none: it has no config_sentence_transformers.json prompts"
        raise UnsupportedCheckpoint(f"{checkpoint.path}: --default-prompt-name {chosen!r} is not one of the "
                                    f"model's prompts (known: {known})")
    return chosen


@dataclass(frozen=True)
class PromptChoice:
    """What one request asked for: a named prompt's text (prepended, or the system message of chat-templated
    inputs), or a filled instruction template; both None: texts embed verbatim."""

    prefix: str | None = None
    instruction: Callable[[str], str] | None = None

    def apply(self, text: str) -> str:
        if self.instruction is not None:
            return self.instruction(text)
        return (self.prefix or "") + text


def choose_task(info: ModelInfo, task: str | None, prompt_name: str | None = None) -> str | None:
    """The task adapter a request runs with (jina-embeddings-v3): its `task`, else its `prompt_name` when that
    names a task (the model card passes both: encode(task=t, prompt_name=t)), else the model's default task;
    None: the adapters off. A task the model does not have, or any task for a model without adapters, is
    InvalidInput naming what the model has."""
    names = [name for name, _ in info.tasks]
    if task is not None:
        if not names:
            raise InvalidInput(f"'task' is not supported by this model ({info.architecture or info.model_type}): it "
                               f"has no task adapters (jina-embeddings-v3 checkpoints with lora_adaptations have them)")
        if task not in names:
            raise InvalidInput(f"task {task!r} is not one of this model's tasks (known: {', '.join(names)})")
        return task
    if prompt_name is not None and prompt_name in names:
        return prompt_name
    return info.default_task


def task_index(info: ModelInfo, task: str | None) -> int | None:
    """A task name (choose_task's) as the index of its adapter, which the model is called with."""
    return None if task is None else [name for name, _ in info.tasks].index(task)


def choose_prompt(info: ModelInfo, prompt_name: str | None, instruction: str | None,
                  task: str | None = None) -> PromptChoice:
    """`instruction` fills the family's template; else `prompt_name` (or the default prompt) applies, as
    sentence-transformers' encode(prompt_name=...) does; unknown names and unsupported instructions are
    InvalidInput naming what the model has. `task` (choose_task's) with neither: the task's instruction, as
    Jina's encode(task=...) puts it before each text (config.json task_instructions, else the prompt of that
    name); a prompt_name naming a task the prompts lack gets that task's instruction too."""
    known = ", ".join(name for name, _ in info.prompts) or "none: the model defines no prompts"
    instructions = dict(info.tasks)
    if instruction is not None:
        if prompt_name is not None:
            raise InvalidInput("'instruction' and 'prompt_name' cannot be combined: the instruction template "
                               "already is the query prompt")
        if info.instruction_template is None:
            raise InvalidInput(f"'instruction' is not supported by this model ({info.model_type}): only families "
                               f"whose model card defines an instruction template take one "
                               f"({', '.join(sorted(INSTRUCTION_TEMPLATES))} embedding models); "
                               f"use 'prompt_name' (known: {known})")
        template = info.instruction_template
        return PromptChoice(instruction=lambda text: template.format(task=instruction, text=text))
    prompts = dict(info.prompts)
    if prompt_name is None and task is not None:
        return PromptChoice(prefix=instructions[task] or prompts.get(task) or None)
    name = prompt_name if prompt_name is not None else info.default_prompt_name
    if name is None:
        return PromptChoice()
    if name not in prompts and name in instructions:
        return PromptChoice(prefix=instructions[name] or None)
    if name not in prompts:
        raise InvalidInput(f"prompt_name {name!r} is not one of this model's prompts (known: {known})")
    return PromptChoice(prefix=prompts[name])


def is_text(prompt: Sequence[str | int]) -> bool:
    """A prompt given as text alone: the only kind a prompt or an instruction applies to (token ids and mixed
    text/token prompts embed exactly as given)."""
    return len(prompt) == 1 and isinstance(prompt[0], str)


def format_prompts(info: ModelInfo, prompts: Sequence[Sequence[str | int]], prompt_name: str | None = None,
                   instruction: str | None = None, task: str | None = None) -> list[list[str | int]]:
    """The request's prompts with its prompt or instruction (or its task's, choose_prompt) applied to the text
    ones."""
    choice = choose_prompt(info, prompt_name, instruction, task)
    return [[choice.apply(prompt[0])] if is_text(prompt) else list(prompt) for prompt in prompts]
