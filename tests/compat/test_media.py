"""compat.media: where an image comes from, under the operator's rules (llama.cpp's own media-path cases)."""
from __future__ import annotations

import base64
import http.server
import os
import re
import socket
import threading
import time
from pathlib import Path

import pytest

from compat.errors import ApiError
from compat.media import MediaPolicy, image_input, load
from compat.wire.inputs import MediaRef

PNG = b"\x89PNG\r\n\x1a\n" + b"\x00" * 40  # only bytes here: decoding is the engine's job
B64 = base64.b64encode(PNG).decode()


def policy(media_path: str | Path | None = None, allow_remote: bool = False, max_bytes: int = 1000) -> MediaPolicy:
    return MediaPolicy.create(str(media_path) if media_path else None, allow_remote, max_bytes, timeout_s=5)


def test_data_urls_and_bare_base64():
    assert load(f"data:image/png;base64,{B64}", policy()) == PNG
    assert load(B64, policy()) == PNG
    assert load(B64[:20] + "\n" + B64[20:], policy()) == PNG  # wrapped base64
    exact = bytes(999)  # 999 bytes (padded base64), wrapped every 76 characters: within the 1000 allowed
    text = base64.b64encode(exact).decode()
    assert load("\n".join(text[i:i + 76] for i in range(0, len(text), 76)), policy()) == exact
    with pytest.raises(ValueError, match="larger than the 998 bytes allowed"):
        load(text, policy(max_bytes=998))


@pytest.mark.parametrize("source,message", [
    (f"data:text/plain;base64,{B64}", "data:image/<type>;base64"),
    ("data:image/png,rawbytes", "must be base64 encoded"),
    ("not base64 at all!", "not a data: URL, a file:// or http(s):// URL, or base64"),
    ("", "the image is empty"),
    (base64.b64encode(b"x" * 2000).decode(), "larger than the 1000 bytes allowed (--media-max-bytes)"),
    ("file://a.png", "file:// URLs are not allowed unless the server is started with --media-path"),
    ("http://127.0.0.1:9/a.png", "not allowed unless the server is started with --allow-remote-media"),
])
def test_refused_sources(source, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        load(source, policy())


@pytest.fixture
def tree(tmp_path, monkeypatch):
    """tmp/ holds an image; tmp/allowed/ holds another; the cwd is tmp_path (llama's tests use relative paths)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "tmp" / "allowed").mkdir(parents=True)
    (tmp_path / "tmp" / "outside.png").write_bytes(PNG + b"outside")
    (tmp_path / "tmp" / "allowed" / "inside.png").write_bytes(PNG)
    (tmp_path / "tmp" / "allowed" / "big.png").write_bytes(PNG * 100)
    return tmp_path


def test_files_inside_the_media_path_load(tree):
    assert load("file://inside.png", policy("./tmp/allowed")) == PNG  # relative to --media-path
    assert load(f"file://{tree}/tmp/allowed/inside.png", policy("tmp/allowed")) == PNG  # absolute inside
    assert load("file://allowed/inside.png", policy("./tmp")) == PNG
    assert load("file://in%73ide.png", policy("tmp/allowed")) == PNG  # percent-encoded


@pytest.mark.parametrize("media_path,url,message", [
    # llama.cpp's test_vision_chat_completion_local_files cases, each refused
    ("./tmp/allowed", "file://../outside.png", "must not contain '..'"),
    ("./tmp/allowed", "file://./../outside.png", "must not contain '..'"),
    ("./tmp/allowed", "file://{root}/tmp/allowed/../outside.png", "must not contain '..'"),
    ("./tmp/allowed", "file://{root}/tmp/outside.png", "outside --media-path"),
    ("./tm", "file://{root}/tmp/outside.png", "outside --media-path"),  # a sibling with the root as prefix
    ("./tmp/allowed", "file://missing.png", "does not exist"),
    ("./tmp/allowed", "file://", "names no file"),
    ("./tmp/allowed", "file://big.png", "more than the 1000 bytes allowed"),
    ("./tmp", "file://allowed", "does not exist"),  # a folder is not a file
])
def test_files_outside_the_media_path_are_refused(tree, media_path, url, message):
    (tree / "tm").mkdir(exist_ok=True)
    with pytest.raises(ValueError, match=message):
        load(url.format(root=tree), policy(media_path))


@pytest.mark.parametrize("media_path,url,outcome", [
    # llama.cpp's test_security.py test_local_media_file cases (mtmd/test-1.jpeg under the media path)
    (None, "file://mtmd/test-1.jpeg", "file:// URLs are not allowed unless"),
    ("tools", "file://mtmd/test-1.jpeg", None),
    ("tools", "file:////mtmd//test-1.jpeg", None),  # the same file: read relative to the media path
    ("tools", "file://mtmd/notfound.jpeg", "does not exist"),
    ("tools", "file://../mtmd/test-1.jpeg", "must not contain '..'"),
])
def test_llama_cpp_security_cases(tmp_path, monkeypatch, media_path, url, outcome):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "tools" / "mtmd").mkdir(parents=True)
    (tmp_path / "tools" / "mtmd" / "test-1.jpeg").write_bytes(PNG)
    (tmp_path / "mtmd").mkdir()
    (tmp_path / "mtmd" / "test-1.jpeg").write_bytes(PNG + b"outside")  # what '..' would reach
    if outcome is None:
        assert load(url, policy(media_path)) == PNG
    else:
        with pytest.raises(ValueError, match=re.escape(outcome)):
            load(url, policy(media_path))


def test_absolute_paths_outside_the_media_path_are_refused_not_looked_up(tree):
    with pytest.raises(ValueError, match="outside --media-path"):
        load("file:///etc/passwd", policy("tmp/allowed"))
    (tree / "tmp" / "allowed" / "etc").mkdir()
    (tree / "tmp" / "allowed" / "etc" / "passwd").write_bytes(PNG)
    assert load("file:///etc/passwd", policy("tmp/allowed")) == PNG  # llama.cpp's reading: under the media path


def test_symlinks_are_resolved_before_the_check(tree):
    os.symlink(tree / "tmp" / "outside.png", tree / "tmp" / "allowed" / "escape.png")
    os.symlink(tree / "tmp" / "allowed" / "inside.png", tree / "tmp" / "allowed" / "alias.png")
    with pytest.raises(ValueError, match="outside --media-path"):
        load("file://escape.png", policy("tmp/allowed"))
    assert load("file://alias.png", policy("tmp/allowed")) == PNG


@pytest.fixture(scope="module")
def loopback():
    """A loopback HTTP server: /small.png, /big.png, /slow.png (a byte every 0.1 s), anything else 404."""
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (http.server's name)
            if self.path == "/slow.png":
                self.send_response(200)
                self.end_headers()
                try:
                    for byte in PNG[:40]:
                        self.wfile.write(bytes([byte]))
                        self.wfile.flush()
                        time.sleep(0.1)
                except OSError:  # the client gave up, as it should
                    pass
                return
            body = {"/small.png": PNG, "/big.png": PNG * 100}.get(self.path)
            self.send_response(200 if body else 404)
            self.end_headers()
            if body:
                self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    thread.join()


def test_a_trickling_download_stops_at_the_media_timeout(loopback):
    started = time.monotonic()
    with pytest.raises(ValueError, match="took longer than 0.5 s"):
        load(f"{loopback}/slow.png", MediaPolicy.create(None, True, 1000, timeout_s=0.5))
    assert time.monotonic() - started < 2.5  # the whole trickle would take 4 s


@pytest.fixture
def slow_headers():
    """A loopback socket server that accepts, then sends its status line and headers a byte every 0.1 s (4 s in
    all): each receive is quick, the headers are not."""
    listener = socket.create_server(("127.0.0.1", 0))
    answer = b"HTTP/1.1 200 OK\r\nContent-Type: image/png\r\nX-Pad: " + b"x" * 10 + b"\r\n\r\n" + PNG
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with conn:
                try:
                    conn.recv(65536)
                    for byte in answer[:40]:
                        if stop.is_set():
                            return
                        conn.sendall(bytes([byte]))
                        time.sleep(0.1)
                    conn.sendall(answer[40:])
                except OSError:  # the client gave up, as it should
                    pass

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    stop.set()
    listener.close()
    thread.join(5)


def test_slow_headers_stop_at_the_media_timeout(slow_headers):
    started = time.monotonic()
    with pytest.raises(ValueError, match=r"took longer than 0.5 s \(--media-timeout\)"):
        load(f"{slow_headers}/a.png", MediaPolicy.create(None, True, 1000, timeout_s=0.5))
    assert time.monotonic() - started < 1.5  # the headers alone take 4 s


def test_slow_name_resolution_stops_at_the_media_timeout(loopback, monkeypatch):
    port = int(loopback.rsplit(":", 1)[1])
    resolve = socket.getaddrinfo

    def slow_resolver(host, *args, **kwargs):
        if host == "slow-resolver.invalid":  # a resolver that answers, loopback, after 3 s
            time.sleep(3)
            host = "127.0.0.1"
        return resolve(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", slow_resolver)
    started = time.monotonic()
    with pytest.raises(ValueError, match=r"took longer than 0.5 s \(--media-timeout\)"):
        load(f"http://slow-resolver.invalid:{port}/small.png", MediaPolicy.create(None, True, 1000, timeout_s=0.5))
    assert time.monotonic() - started < 1.5
    # a resolver within the deadline: the download goes on
    assert load(f"http://localhost:{port}/small.png", policy(allow_remote=True)) == PNG


def test_remote_images_only_when_allowed_and_bounded(loopback):
    with pytest.raises(ValueError, match="--allow-remote-media"):
        load(f"{loopback}/small.png", policy())
    assert load(f"{loopback}/small.png", policy(allow_remote=True)) == PNG
    with pytest.raises(ValueError, match="larger than the 1000 bytes allowed"):
        load(f"{loopback}/big.png", policy(allow_remote=True))
    with pytest.raises(ValueError, match="HTTP 404"):
        load(f"{loopback}/missing.png", policy(allow_remote=True))


def test_an_input_keeps_its_parts_in_order_and_errors_name_it():
    got = image_input("input 3", ["caption ", MediaRef(B64), " between ", MediaRef(B64)], policy())
    assert got.parts == ("caption ", PNG, " between ", PNG)
    assert got.text == "caption  between " and got.images == [PNG, PNG]
    for prompt, message in (([MediaRef(B64), 5], "input 2: token ids cannot be combined"),
                            ([MediaRef("file://x.png")], "input 2: file:// URLs are not allowed")):
        with pytest.raises(ApiError) as caught:
            image_input("input 2", prompt, policy())
        assert caught.value.status == 400 and message in caught.value.message
