"""Where an image in a request comes from -> its bytes, under the operator's rules.

Sources: `data:image/...;base64,...` URLs and bare base64 always; `file://` paths only inside --media-path
(relative to it as llama.cpp reads them, leading slashes included, or absolute inside it; no `..`, symlinks
resolved before the check); `http(s)://` only with
--allow-remote-media, fetched with a byte cap and a timeout. Every source is bounded by --media-max-bytes.
`load` raises ValueError with a message for the client; `image_input` turns it into a 400 naming the input.
"""
from __future__ import annotations

import base64
import binascii
import functools
import os
import re
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

from compat.errors import bad_request
from compat.wire.inputs import MediaRef, Prompt, has_media
from engine.types import ImageInput

if TYPE_CHECKING:
    from compat.settings import Settings

_DATA_URL = re.compile(r"data:([^;,]*)((?:;[^;,]*)*),(.*)", re.DOTALL)


@dataclass(frozen=True)
class MediaPolicy:
    media_path: Path | None  # resolved root for file:// URLs; None: file:// refused
    allow_remote: bool
    max_bytes: int
    timeout_s: float

    @classmethod
    def create(cls, media_path: str | None, allow_remote: bool, max_bytes: int, timeout_s: float) -> MediaPolicy:
        root = Path(media_path).expanduser().resolve() if media_path else None
        return cls(media_path=root, allow_remote=allow_remote, max_bytes=max_bytes, timeout_s=timeout_s)


def load(source: str, policy: MediaPolicy) -> bytes:
    """The bytes an image source names."""
    if source.startswith("data:"):
        return _data_url(source, policy)
    if source.startswith("file://"):
        return _local_file(source, policy)
    if source.startswith(("http://", "https://")):
        return _remote(source, policy)
    return _base64(source, policy)


def _base64(text: str, policy: MediaPolicy) -> bytes:
    compact = re.sub(r"\s+", "", text)  # line-wrapped base64 is common; the wrapping is not the image's size
    if len(compact) // 4 * 3 - compact[-2:].count("=") > policy.max_bytes:
        raise ValueError(f"the image is larger than the {policy.max_bytes} bytes allowed (--media-max-bytes)")
    try:
        data = base64.b64decode(compact, validate=True)
    except (binascii.Error, ValueError):
        raise ValueError("the image is not a data: URL, a file:// or http(s):// URL, or base64") from None
    if not data:
        raise ValueError("the image is empty")
    return data


def _data_url(url: str, policy: MediaPolicy) -> bytes:
    match = _DATA_URL.fullmatch(url)
    if match is None or not match.group(1).startswith("image/"):
        raise ValueError("a data: URL must be data:image/<type>;base64,<data>")
    if "base64" not in match.group(2).split(";"):
        raise ValueError("a data: URL must be base64 encoded (data:image/<type>;base64,<data>)")
    return _base64(match.group(3), policy)


def _local_file(url: str, policy: MediaPolicy) -> bytes:
    if policy.media_path is None:
        raise ValueError("file:// URLs are not allowed unless the server is started with --media-path")
    raw = urllib.parse.unquote(url[len("file://"):])
    if not raw or "\0" in raw:
        raise ValueError("the file:// URL names no file")
    if ".." in re.split(r"[\\/]+", raw):
        raise ValueError("file:// paths must not contain '..'")
    root = policy.media_path
    # llama.cpp reads the path relative to --media-path, leading slashes included (file:////a//b.png is a/b.png);
    # an absolute path that lies inside --media-path is read as it is
    relative = _inside(root, root / raw.lstrip("/\\"))
    absolute = _inside(root, Path(raw)) if os.path.isabs(raw) else None
    resolved = absolute or relative
    if resolved is None or (os.path.isabs(raw) and absolute is None and not relative.is_file()):
        raise ValueError(f"file path is not allowed: {raw} is outside --media-path")
    if not resolved.is_file():
        raise ValueError(f"file does not exist or cannot be opened: {raw}")
    try:
        with resolved.open("rb") as file:  # read up to the bound, whatever its size said (it may be growing)
            data = file.read(policy.max_bytes + 1)
    except OSError:
        raise ValueError(f"file does not exist or cannot be opened: {raw}") from None
    if len(data) > policy.max_bytes:
        raise ValueError(f"{raw} has more than the {policy.max_bytes} bytes allowed (--media-max-bytes)")
    return data


def _inside(root: Path, candidate: Path) -> Path | None:
    """candidate with symlinks resolved (so the check sees where the file really is), if that is inside root."""
    resolved = candidate.resolve()
    return resolved if resolved == root or root in resolved.parents else None


def _remote(url: str, policy: MediaPolicy) -> bytes:
    if not policy.allow_remote:
        raise ValueError("http(s) image URLs are not allowed unless the server is started with --allow-remote-media")
    deadline = time.monotonic() + policy.timeout_s
    request = urllib.request.Request(url, headers={"User-Agent": "mlx-embed-server"})
    chunks, size = [], 0
    try:
        with urllib.request.urlopen(request, timeout=policy.timeout_s) as response:  # noqa: S310 (operator-enabled)
            # read1: what one receive brings (read(n) would wait for n bytes, so a server trickling bytes could
            # hold the request far past --media-timeout; each receive is bounded by the socket timeout)
            while chunk := response.read1(1 << 16):
                size += len(chunk)
                if size > policy.max_bytes:
                    raise ValueError(f"the image is larger than the {policy.max_bytes} bytes allowed "
                                     f"(--media-max-bytes)")
                if time.monotonic() > deadline:
                    raise ValueError(f"downloading the image took longer than {policy.timeout_s:g} s "
                                     f"(--media-timeout)")
                chunks.append(chunk)
    except urllib.error.HTTPError as exc:
        raise ValueError(f"downloading the image failed: HTTP {exc.code}") from None
    except (urllib.error.URLError, TimeoutError, OSError) as exc:
        raise ValueError(f"downloading the image failed: {getattr(exc, 'reason', exc)}") from None
    return b"".join(chunks)


def image_input(label: str, prompt: Prompt, policy: MediaPolicy) -> ImageInput:
    """One request input holding images -> the engine's ImageInput: its text pieces and the images' bytes, in
    the order the request gave them (how many images a request may hold is checked before, per request).

    label names the input in errors: "input 2", "query", "document 3"."""
    if any(not isinstance(part, (str, MediaRef)) for part in prompt):
        raise bad_request(f"{label}: token ids cannot be combined with an image")
    parts: list[str | bytes] = []
    for part in prompt:
        if isinstance(part, str):
            parts.append(part)
            continue
        try:
            parts.append(load(part.source, policy))
        except ValueError as exc:
            raise bad_request(f"{label}: {exc}") from None
    return ImageInput(tuple(parts))


def with_images(labels: Sequence[str], inputs: Sequence[str | Prompt],
                settings: Settings) -> list[str | Prompt | ImageInput]:
    """A request's inputs, each one holding images turned into an ImageInput with its images fetched (the others
    as they are). Too many images are refused before any is fetched; labels name the inputs in errors."""
    holding = [not isinstance(item, str) and has_media(item) for item in inputs]
    n_images = sum(isinstance(part, MediaRef) for item, held in zip(inputs, holding) if held for part in item)
    if n_images > settings.image_max_count:
        raise bad_request(f"the request has {n_images} images; at most {settings.image_max_count} are allowed "
                          f"(--image-max-count)")
    if n_images == 0:
        return list(inputs)
    policy = _policy(settings.media_path, settings.allow_remote_media, settings.media_max_bytes,
                     settings.media_timeout)
    return [image_input(label, item, policy) if held else item for label, item, held in zip(labels, inputs, holding)]


# once per server, not per request: resolving --media-path walks the file system
_policy = functools.lru_cache(maxsize=8)(MediaPolicy.create)
