"""--lora / --lora-scaled as llama-server reads them (common/arg.cpp): comma-separated adapter files, each --lora
at scale 1, each --lora-scaled item FNAME:SCALE; they reach the engine in order."""
from __future__ import annotations

import pytest

from compat.settings import SettingsError, parse_settings


def _engine_lora(argv: list[str]) -> tuple[tuple[str, float], ...]:
    return parse_settings(["-m", "m.gguf", *argv], {}, system_config_files=[]).engine_options("m.gguf").lora


def test_lora_and_lora_scaled_reach_the_engine():
    assert _engine_lora([]) == ()
    assert _engine_lora(["--lora", "a.gguf,b.gguf", "--lora", "c.gguf"]) == (("a.gguf", 1.0), ("b.gguf", 1.0),
                                                                              ("c.gguf", 1.0))
    assert _engine_lora(["--lora-scaled", "a.gguf:0.5,b.gguf:2", "--lora", "c.gguf"]) == (
        ("c.gguf", 1.0), ("a.gguf", 0.5), ("b.gguf", 2.0))


@pytest.mark.parametrize("value", ["a.gguf", "a.gguf:x", "a:b:1"])
def test_a_lora_scaled_item_without_its_scale_is_refused(value):
    with pytest.raises(SettingsError, match="lora-scaled|scaled"):
        _engine_lora(["--lora-scaled", value])
