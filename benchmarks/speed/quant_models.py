"""Random-weight Llama-shaped 1B / 3B models as GGUF files, quantized by llama.cpp's own tools.

    python benchmarks/speed/quant_models.py [--size 1b|3b ...] [--quant Q4_K_M Q8_0]

The issue-39 benchmark models. Each size is made in four cached steps (a step whose output
exists is skipped), under ``${AGENTSERVE_CACHE_DIR:-~/.cache/agentserve}/quant/<size>/``:

1. ``hf/``: ``agentserve make-test-model --family llama3_json`` (its real Llama-3 tokenizer, its
   family) re-made at Llama 3.2's shape (below) with random bf16 weights (``make-test-model``
   writes fp32 at its own small shape: a 3B fp32 folder would be 12 GB).
2. ``f16.gguf``: llama.cpp's ``convert_hf_to_gguf.py`` from the llama-cpp-python sdist that the
   installed wheel was built from (``vendor/llama.cpp``; unpacked, not built).
3. ``<QUANT>.gguf``: ``llama_cpp.llama_model_quantize`` (the library's own quantizer, no
   ``llama-quantize`` binary).

Prints each step's wall time and writes them to ``quant/<size>/timings.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

VERSION = "0.3.36"  # the llama-cpp-python whose vendored llama.cpp converts (scripts/install_llamacpp.sh)
SHAPES = {  # Llama 3.2 1B / 3B (tied embeddings, 128,256-token vocabulary)
    "1b": {
        "hidden_size": 2048,
        "intermediate_size": 8192,
        "num_hidden_layers": 16,
        "num_attention_heads": 32,
    },
    "3b": {
        "hidden_size": 3072,
        "intermediate_size": 8192,
        "num_hidden_layers": 28,
        "num_attention_heads": 24,
    },
}
FTYPES = {"Q4_K_M": 15, "Q8_0": 7}  # llama_cpp.LLAMA_FTYPE_MOSTLY_*


def cache() -> Path:
    return Path(os.environ.get("AGENTSERVE_CACHE_DIR", Path.home() / ".cache" / "agentserve")) / "quant"


def convert_script() -> Path:
    """``convert_hf_to_gguf.py`` (with its ``conversion/`` and ``gguf-py/``) unpacked from the sdist."""
    root = cache() / f"llama_cpp_python-{VERSION}" / "vendor" / "llama.cpp"
    script = root / "convert_hf_to_gguf.py"
    if script.exists():
        return script
    sdist = cache().parent / f"llamacpp-{VERSION}" / f"llama_cpp_python-{VERSION}.tar.gz"
    if not sdist.exists():
        sdist.parent.mkdir(parents=True, exist_ok=True)
        pip = [sys.executable, "-m", "pip", "download", "--no-binary", ":all:", "--no-deps"]
        subprocess.run([*pip, f"llama-cpp-python=={VERSION}", "-d", str(sdist.parent)], check=True)
    prefix = f"llama_cpp_python-{VERSION}/vendor/llama.cpp/"
    wanted = (prefix + "convert_hf_to_gguf.py", prefix + "conversion/", prefix + "gguf-py/")
    with tarfile.open(sdist) as tar:
        members = [m for m in tar.getmembers() if m.name.startswith(wanted)]
        tar.extractall(cache(), members=members, filter="data")
    return script


def make_hf(size: str, out: Path) -> None:
    """The family's test-model folder (tokenizer, family), then random bf16 weights at ``size``'s shape."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from server.families.test_model import make_test_model

    make_test_model("llama3_json", out)
    cfg = AutoConfig.from_pretrained(out)
    shape = {**SHAPES[size], "num_key_value_heads": 8, "rope_theta": 500000.0}
    shape["head_dim"] = shape["hidden_size"] // shape["num_attention_heads"]  # set at init: not derived
    for k, v in shape.items():
        setattr(cfg, k, v)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)  # type: ignore[no-untyped-call]
    n = sum(p.numel() for p in model.parameters())
    print(f"{size}: {n / 1e9:.2f} B parameters", flush=True)
    for f in out.glob("model*.safetensors*"):
        f.unlink()
    model.save_pretrained(out)


def quantize(src: Path, dst: Path, quant: str) -> None:
    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = FTYPES[quant]
    params.nthread = os.cpu_count() or 1
    tmp = dst.with_suffix(".tmp")
    rc = llama_cpp.llama_model_quantize(str(src).encode(), str(tmp).encode(), params)
    if rc != 0:
        raise RuntimeError(f"llama_model_quantize {src} -> {quant} failed ({rc})")
    tmp.rename(dst)


def step(timings: dict[str, float], name: str, out: Path, fn) -> None:
    if out.exists():
        print(f"{name}: {out} (cached)", flush=True)
        return
    t0 = time.perf_counter()
    fn()
    timings[name] = round(time.perf_counter() - t0, 1)
    print(f"{name}: {timings[name]:.1f} s -> {out}", flush=True)


def make(size: str, quants: list[str]) -> dict[str, float]:
    d = cache() / size
    d.mkdir(parents=True, exist_ok=True)
    path = d / "timings.json"
    timings: dict[str, float] = json.loads(path.read_text()) if path.exists() else {}
    hf, f16 = d / "hf", d / "f16.gguf"
    step(timings, "make_hf_bf16", hf / "config.json", lambda: make_hf(size, hf))
    script = convert_script()

    def convert() -> None:
        tmp = f16.with_suffix(".tmp")
        cmd = [sys.executable, str(script), str(hf), "--outfile", str(tmp), "--outtype", "f16"]
        subprocess.run(cmd, check=True, capture_output=True)
        tmp.rename(f16)

    step(timings, "convert_f16", f16, convert)
    for q in quants:
        step(timings, f"quantize_{q}", d / f"{q}.gguf", lambda q=q: quantize(f16, d / f"{q}.gguf", q))
    timings.update({f"size_mb_{p.stem}": round(p.stat().st_size / 2**20) for p in d.glob("*.gguf")})
    path.write_text(json.dumps(timings, indent=2) + "\n")
    return timings


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", nargs="+", choices=sorted(SHAPES), default=["1b"])
    ap.add_argument("--quant", nargs="+", choices=sorted(FTYPES), default=["Q4_K_M", "Q8_0"])
    args = ap.parse_args()
    for size in args.size:
        print(size, json.dumps(make(size, args.quant)), flush=True)


if __name__ == "__main__":
    main()
