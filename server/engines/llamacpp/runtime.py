"""llama.cpp through llama-cpp-python's low-level (ctypes) API: a model, one context, one batch.

Every ``import llama_cpp`` of the server is in this file. ``LlamaRuntime`` loads a GGUF
(memory-mapped: resident at its quantized size), opens one context whose KV cache is
*unified* (every sequence's cells in one pool, so ``seq_cp`` shares a prefix's cells between
sequences instead of copying them) and decodes a ``llama_batch`` that holds tokens of many
sequences at once. Logits come back per row as a float32 tensor that *views* llama.cpp's
buffer (valid until the next ``decode``): the engine masks and samples them itself.
"""

from __future__ import annotations

import ctypes
import logging
import os
from pathlib import Path

import llama_cpp
import numpy as np
import torch

from server.engines.llamacpp.batch import KVFull, Row

log = logging.getLogger(__name__)


_LOG_CB: object = None


def _quiet() -> None:
    """llama.cpp's own logging to Python's (debug), once: its load banner is not ours to print."""
    global _LOG_CB
    if _LOG_CB is not None:
        return

    def cb(level: int, text: bytes, data: ctypes.c_void_p) -> None:
        if log.isEnabledFor(logging.DEBUG):
            log.debug("llama.cpp: %s", text.decode("utf-8", "replace").rstrip())

    _LOG_CB = llama_cpp.llama_log_callback(cb)  # kept: llama.cpp calls it for the process's life
    llama_cpp.llama_log_set(_LOG_CB, ctypes.c_void_p(0))


class LlamaRuntime:
    """A GGUF model (memory-mapped) and, once ``open``, one context shared by many sequences."""

    def __init__(self, path: Path, threads: int | None = None) -> None:
        _quiet()
        llama_cpp.llama_backend_init()
        mp = llama_cpp.llama_model_default_params()
        mp.n_gpu_layers = int(os.environ.get("AGENTSERVE_LLAMACPP_GPU_LAYERS", "0"))  # docs/llamacpp.md
        # llama.cpp repacks quantized weights for its CPU GEMM kernels: a second copy in anonymous
        # memory beside the mmap'd file's pages (clean, reclaimable, but counted as resident).
        # AGENTSERVE_LLAMACPP_REPACK=0 keeps the file's layout: docs/llamacpp.md "Resident memory"
        mp.use_extra_bufts = os.environ.get("AGENTSERVE_LLAMACPP_REPACK", "1") != "0"
        model = llama_cpp.llama_model_load_from_file(str(path).encode(), mp)
        if not model:
            raise RuntimeError(f"llama.cpp could not load {path}")
        self.path = path
        self.model = model
        self.model_params = mp
        self.threads = threads or os.cpu_count() or 1
        self.vocab = llama_cpp.llama_model_get_vocab(model)
        self.n_vocab = int(llama_cpp.llama_vocab_n_tokens(self.vocab))
        self.n_ctx_train = int(llama_cpp.llama_model_n_ctx_train(model))
        self.ctx = None
        self.params: llama_cpp.llama_context_params | None = None
        self.n_ctx = 0

    def kv_bytes_per_token(self) -> int:
        """f16 K and V of every layer for one token (sizes the cell pool)."""
        n_layer = int(llama_cpp.llama_model_n_layer(self.model))
        n_head = max(1, int(llama_cpp.llama_model_n_head(self.model)))
        n_head_kv = int(llama_cpp.llama_model_n_head_kv(self.model)) or n_head
        head_dim = int(llama_cpp.llama_model_n_embd(self.model)) // n_head
        return 2 * 2 * n_layer * n_head_kv * head_dim

    def open(self, n_ctx: int, n_seq: int, n_batch: int) -> None:
        """The context: ``n_ctx`` cells in one unified pool, ``n_seq`` sequences, ``n_batch`` a decode."""
        cp = llama_cpp.llama_context_default_params()
        cp.n_ctx = n_ctx
        cp.n_batch = n_batch
        cp.n_ubatch = n_batch  # a turn (a prompt chunk + every running row) is one graph, not split
        cp.n_seq_max = n_seq
        cp.kv_unified = True  # one pool of cells: seq_cp shares a prefix, it does not copy it
        cp.no_perf = True
        # every decode attends over the pool's used range (idle sessions' cells too); ggml's CPU
        # flash attention skips the cells the mask hides, the plain path multiplies them all.
        # Measured (benchmarks/results/llamacpp_quant.md, issue 39): a cold 512-token prompt runs
        # 1.25-1.6x faster with it than without, on an empty pool as on one other sessions hold
        cp.flash_attn_type = llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED
        cp.n_threads = self.threads
        cp.n_threads_batch = self.threads
        ctx = llama_cpp.llama_init_from_model(self.model, cp)
        if not ctx:
            raise RuntimeError(f"llama.cpp could not create a context of {n_ctx} cells for {self.path}")
        self.ctx = ctx
        self.params = cp  # what the context was made with (llama.cpp has no getter for every field)
        self.n_ctx = int(llama_cpp.llama_n_ctx(ctx))
        self.mem = llama_cpp.llama_get_memory(ctx)
        self._batch = llama_cpp.llama_batch_init(n_batch, 0, 1)

    # -- the KV cache ----------------------------------------------------------------------------------
    def seq_copy(self, src: int, dst: int, n: int) -> None:
        """Sequence ``dst`` gets ``src``'s first ``n`` positions (the cells are shared, not copied)."""
        llama_cpp.llama_memory_seq_cp(self.mem, src, dst, 0, n)

    def seq_trim(self, seq: int, n: int) -> None:
        """Drop sequence ``seq``'s positions from ``n`` on (0: all of it)."""
        llama_cpp.llama_memory_seq_rm(self.mem, seq, n, -1)

    def seq_save(self, seq: int) -> torch.Tensor:
        """The KV state of sequence ``seq`` (its cells, positions and tokens) as bytes: a uint8 tensor."""
        n = int(llama_cpp.llama_state_seq_get_size(self.ctx, seq))
        out = torch.empty(n, dtype=torch.uint8)
        ptr = ctypes.cast(out.data_ptr(), ctypes.POINTER(ctypes.c_uint8))
        got = int(llama_cpp.llama_state_seq_get_data(self.ctx, ptr, n, seq))
        return out[:got]

    def seq_load(self, seq: int, state: torch.Tensor) -> bool:
        """Sequence ``seq`` (emptied first) gets a state ``seq_save`` returned; False: no room in the pool."""
        self.seq_trim(seq, 0)
        data = state.contiguous()
        ptr = ctypes.cast(data.data_ptr(), ctypes.POINTER(ctypes.c_uint8))
        if int(llama_cpp.llama_state_seq_set_data(self.ctx, ptr, data.numel(), seq)) == 0:
            self.seq_trim(seq, 0)  # a failed load may leave part of it
            return False
        return True

    # -- decode ------------------------------------------------------------------------------------------
    def decode(self, rows: list[Row]) -> list[int]:
        """Run ``rows`` (at most ``n_batch``) through the model; the batch indices whose logits are kept."""
        b = self._batch
        wanted: list[int] = []
        for i, r in enumerate(rows):
            b.token[i] = r.token
            b.pos[i] = r.pos
            b.n_seq_id[i] = 1
            b.seq_id[i][0] = r.seq
            b.logits[i] = 1 if r.logits else 0
            if r.logits:
                wanted.append(i)
        b.n_tokens = len(rows)
        rc = llama_cpp.llama_decode(self.ctx, b)
        if rc == 1:
            raise KVFull(f"no room in the KV cache for {len(rows)} tokens")
        if rc != 0:
            raise RuntimeError(f"llama_decode failed ({rc})")
        return wanted

    def logits(self, i: int) -> torch.Tensor:
        """The logits of batch row ``i`` of the last decode: a float32 [V] view (valid until the next)."""
        ptr = llama_cpp.llama_get_logits_ith(self.ctx, i)
        return torch.from_numpy(np.ctypeslib.as_array(ptr, shape=(self.n_vocab,)))

    def close(self) -> None:
        if self.ctx:
            llama_cpp.llama_batch_free(self._batch)
            llama_cpp.llama_free(self.ctx)
            self.ctx = None
        if self.model:
            llama_cpp.llama_model_free(self.model)
            self.model = None
