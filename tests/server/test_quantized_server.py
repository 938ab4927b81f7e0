"""An MLX-quantized folder served for real: /props, /v1/models and the startup log say how its weights run
(dequantized at load on a CPU by default; quantized kernels with --keep-quantized or LLAMA_ARG_KEEP_QUANTIZED)
and what they hold in memory."""
from __future__ import annotations

import numpy as np

from engine.loading import weights
from tests.engine.families.decoder_fixture import save_random
from tests.engine.test_weights import quantize_folder
from tests.server.harness import ServerProcess, clean_env


def test_props_and_log_say_how_quantized_weights_run(tmp_path):
    src, _ = save_random(tmp_path / "m", "LlamaForCausalLM", "LlamaConfig", seed=12, tie_word_embeddings=True)
    folder = tmp_path / "q4"
    quantize_folder(src, folder, 4)
    dense = "dequantized to float32 at load" if weights.on_cpu() else "quantized kernels"
    seen = {}
    for name, args, env in (("default", (), clean_env()),
                            ("flag", ("--keep-quantized",), clean_env()),
                            ("env", (), clean_env(LLAMA_ARG_KEEP_QUANTIZED="1"))):
        with ServerProcess("-m", str(folder), "--embedding", "--pooling", "mean", *args, env=env) as srv:
            props = srv.get("/props").json()
            meta = srv.get("/v1/models").json()["data"][0]["meta"]
            vector = np.asarray(srv.post("/v1/embeddings", {"input": "hello world"}).json()["data"][0]["embedding"])
            log = srv.output()
        assert (meta["weights"], meta["resident_bytes"]) == (props["weights"], props["resident_bytes"])
        assert meta["size"] == props["resident_bytes"] and meta["ftype"] == "MLX_Q4_G32/F32"
        assert f"weights {props['weights']} ({props['resident_bytes']} bytes resident)" in log
        seen[name] = props["weights"], props["resident_bytes"], vector
    assert seen["default"][0] == dense
    assert seen["flag"][0] == seen["env"][0] == "quantized kernels"
    assert seen["flag"][1] == seen["env"][1]
    if weights.on_cpu():
        assert seen["default"][1] > 3 * seen["flag"][1]  # float32 against 4 bits (+ scales and biases)
    assert float(seen["default"][2] @ seen["flag"][2]) >= 0.99999  # normalized: the same dequantized math
