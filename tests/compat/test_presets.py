"""The INI dialect of llama.cpp's config.ini and preset files (docs/llama-server-contract.md §7.4)."""
import pytest

from compat.presets import IniEntry, PresetError, parse_ini


def test_sections_in_order_with_keys_before_any_header_in_section_empty():
    text = "port = 1\n[*]\nc = 2\n[ggml-org/X-GGUF:Q8_0]\nhf-repo = ggml-org/X-GGUF:Q8_0\n[default]\n"
    sections = parse_ini(text, "a.ini")
    assert list(sections) == ["", "*", "ggml-org/X-GGUF:Q8_0", "default"]
    assert sections[""] == [IniEntry("port", "1", 1)]
    assert sections["*"] == [IniEntry("c", "2", 3)]
    assert sections["ggml-org/X-GGUF:Q8_0"] == [IniEntry("hf-repo", "ggml-org/X-GGUF:Q8_0", 5)]
    assert sections["default"] == []


def test_comments_blank_lines_and_values():
    text = (
        "; a comment\n"
        "# another\n"
        "\n"
        "   \t\n"
        "[ * ]  ; header comment\n"
        "host = 0.0.0.0   # trailing comment\n"
        "cors-methods = GET, POST;no space needed\n"
        "empty =\n"
        "url = http://x/?a=b\n"
        "key.with_odd-chars = two  words  \n"
        "  indented = yes\n"
    )
    assert parse_ini(text, "a.ini") == {"*": [
        IniEntry("host", "0.0.0.0", 6),
        IniEntry("cors-methods", "GET, POST", 7),
        IniEntry("empty", "", 8),
        IniEntry("url", "http://x/?a=b", 9),
        IniEntry("key.with_odd-chars", "two  words", 10),
        IniEntry("indented", "yes", 11),
    ]}


@pytest.mark.parametrize("newline", ["\n", "\r\n", "\r"])
def test_every_newline_kind(newline):
    text = newline.join(["[*]", "a = 1", "b = 2"])
    assert parse_ini(text, "a.ini") == {"*": [IniEntry("a", "1", 2), IniEntry("b", "2", 3)]}


def test_repeated_header_continues_its_section():
    sections = parse_ini("[m]\na = 1\n[*]\nb = 2\n[m]\nc = 3\n", "a.ini")
    assert list(sections) == ["m", "*"]
    assert [e.key for e in sections["m"]] == ["a", "c"]


def test_empty_file():
    assert parse_ini("", "a.ini") == {}
    assert parse_ini("\ufeff; only a comment\n", "a.ini") == {}


@pytest.mark.parametrize(("text", "line"), [
    ("1port = 8080\n", 1),          # a key starts with a letter or _
    ("[*]\nport 8080\n", 2),         # no '='
    ("[*]\n\n[]\n", 3),              # empty section name
    ("[*\n", 1),                     # unclosed header
    ("[*]\nport-number! = 1\n", 2),  # bad key character
    ("[*] junk\n", 1),
])
def test_syntax_error_names_file_and_line(text, line):
    with pytest.raises(PresetError) as caught:
        parse_ini(text, "/etc/llama.cpp/config.ini")
    assert str(caught.value).startswith(f"/etc/llama.cpp/config.ini:{line}: syntax error")
