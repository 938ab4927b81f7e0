"""Where an image in a request comes from -> its bytes, under the operator's rules.

Sources: `data:image/...;base64,...` URLs and bare base64 always; `file://` paths only inside --media-path
(relative to it as llama.cpp reads them, leading slashes included, or absolute inside it; no `..`, symlinks
resolved before the check); `http(s)://` only with
--allow-remote-media, fetched with a byte cap and one deadline (--media-timeout) over the whole download: name
resolution, connecting, the answer's headers and its body. Every source is bounded by --media-max-bytes.
`load` raises ValueError with a message for the client; `image_input` turns it into a 400 naming the input.
"""
from __future__ import annotations

import base64
import binascii
import functools
import http.client
import os
import re
import socket
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

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


class _Deadline:
    """One deadline over a download, whatever phase it is in. Name resolution runs in a thread of its own that the
    download stops waiting for (a resolver cannot be interrupted; the thread ends when it answers); every socket
    opened waits at most what is left for each operation, and when the deadline passes they are all shut down,
    which ends any read in progress (headers arriving a byte at a time included, over TLS too)."""

    def __init__(self, seconds: float):
        self.seconds = seconds
        self._end = time.monotonic() + seconds
        self._sockets: list[socket.socket] = []  # duplicates of the connections' sockets, for the shutdown
        self._lock = threading.Lock()
        self.passed = False
        self._timer = threading.Timer(seconds, self._pass)
        self._timer.daemon = True
        self._timer.start()

    def left(self) -> float:
        left = self._end - time.monotonic()
        if left <= 0:
            raise TimeoutError("deadline passed")
        return left

    def _pass(self) -> None:
        with self._lock:
            self.passed = True
            for sock in self._sockets:
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:  # already closed by the other side
                    pass

    def close(self) -> None:
        self._timer.cancel()
        with self._lock:
            for sock in self._sockets:
                sock.close()
            self._sockets.clear()

    def _resolve(self, host: str, port: int) -> list[tuple]:
        found: list[Any] = []
        done = threading.Event()

        def resolve() -> None:
            try:
                found.append(socket.getaddrinfo(host, port, 0, socket.SOCK_STREAM))
            except Exception as exc:  # noqa: BLE001 - an IDNA error too: the download fails, naming it
                found.append(exc if isinstance(exc, OSError) else OSError(f"cannot resolve {host!r}: {exc}"))
            done.set()

        threading.Thread(target=resolve, name="media-resolve", daemon=True).start()
        if not done.wait(self.left()):
            raise TimeoutError("deadline passed")
        if isinstance(found[0], OSError):
            raise found[0]
        return found[0]

    def connect(self, address: tuple[str, int], timeout: Any = None, source_address: Any = None) -> socket.socket:
        """socket.create_connection with the deadline: http.client calls it (for HTTPS before wrapping TLS)."""
        error: OSError | None = None
        for family, kind, proto, _, where in self._resolve(*address):
            sock = socket.socket(family, kind, proto)
            try:
                sock.settimeout(self.left())
                if source_address:
                    sock.bind(source_address)
                sock.connect(where)
            except OSError as exc:
                sock.close()
                error = exc
                continue
            with self._lock:
                if self.passed:
                    sock.close()
                    raise TimeoutError("deadline passed")
                self._sockets.append(sock.dup())  # shutting the duplicate down ends reads on the original too
            return sock
        raise error or OSError(f"cannot connect to {address[0]}")

    def connection(self, cls: type[http.client.HTTPConnection]) -> Callable[..., http.client.HTTPConnection]:
        def make(*args: Any, **kwargs: Any) -> http.client.HTTPConnection:
            conn = cls(*args, **kwargs)
            conn._create_connection = self.connect  # type: ignore[attr-defined]  # http.client's own hook
            return conn

        return make


class _HttpHandler(urllib.request.HTTPHandler):
    def __init__(self, deadline: _Deadline):
        super().__init__()
        self._deadline = deadline

    def http_open(self, req: urllib.request.Request) -> Any:
        return self.do_open(self._deadline.connection(http.client.HTTPConnection), req)


class _HttpsHandler(urllib.request.HTTPSHandler):
    def __init__(self, deadline: _Deadline):
        super().__init__()
        self._deadline = deadline

    def https_open(self, req: urllib.request.Request) -> Any:
        return self.do_open(self._deadline.connection(http.client.HTTPSConnection), req, context=self._context)


def _opener(deadline: _Deadline) -> urllib.request.OpenerDirector:
    """urllib's, its connections made under the deadline (redirects and proxies included)."""
    return urllib.request.build_opener(_HttpHandler(deadline), _HttpsHandler(deadline))


def _remote(url: str, policy: MediaPolicy) -> bytes:
    if not policy.allow_remote:
        raise ValueError("http(s) image URLs are not allowed unless the server is started with --allow-remote-media")
    too_slow = f"downloading the image took longer than {policy.timeout_s:g} s (--media-timeout)"
    request = urllib.request.Request(url, headers={"User-Agent": "mlx-embed-server"})
    deadline = _Deadline(policy.timeout_s)
    chunks, size = [], 0
    try:
        with _opener(deadline).open(request, timeout=policy.timeout_s) as response:
            # read1: what one receive brings (read(n) would wait for n bytes); the deadline ends a receive that
            # waits past it
            while chunk := response.read1(1 << 16):
                size += len(chunk)
                if size > policy.max_bytes:
                    raise ValueError(f"the image is larger than the {policy.max_bytes} bytes allowed "
                                     f"(--media-max-bytes)")
                chunks.append(chunk)
        if deadline.passed:  # the shutdown can look like the end of the body
            raise ValueError(too_slow)
    except urllib.error.HTTPError as exc:
        raise ValueError(f"downloading the image failed: HTTP {exc.code}") from None
    except (urllib.error.URLError, http.client.HTTPException, OSError) as exc:
        if deadline.passed or isinstance(exc, TimeoutError) or isinstance(getattr(exc, "reason", None), TimeoutError):
            raise ValueError(too_slow) from None
        raise ValueError(f"downloading the image failed: {getattr(exc, 'reason', exc)}") from None
    finally:
        deadline.close()
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
