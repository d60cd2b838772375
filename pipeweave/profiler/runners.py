"""Operator runners: build preallocated inputs for one grid row and return the launch as a closure.

torch (and flash-attn / flashinfer, when installed) are imported lazily, so importing this module needs
neither CUDA nor torch. Runners work on any torch device, which lets the CPU tests check every code
path's shapes; the measurements themselves only make sense on CUDA.

Backends, in order of preference (the ``kernel`` column records which one ran):

* gemm: ``torch.nn.functional.linear`` (cuBLAS/cuBLASLt) in BF16.
* gemm_fp8: ``torch._scaled_mm`` with per-tensor scales, FP8 e4m3 inputs, BF16 output (compute capability ≥ 8.9).
* attn prefill: FlashAttention-3 (``flash_attn_interface``, Hopper only) → ``fa3_ragged``;
  FlashAttention-2 ``flash_attn_varlen_func`` → ``fa2_ragged``; torch SDPA restricted to its flash backend
  (uniform lengths only) → ``fa2_ragged``.
* attn decode: on Hopper with FlashAttention-3 installed, its ``flash_attn_with_kvcache`` on a paged KV cache of
  16-token pages (the split-KV kernels serving engines run there, which aiconfigurator's Hopper rows time and the
  analytical model describes as ``fa2_paged``); else FlashAttention-2 ``flash_attn_with_kvcache`` on pages of 256
  tokens (its smallest) → ``fa2_paged``; torch SDPA flash backend on a contiguous cache (uniform lengths only) →
  ``fa2_paged``.
* rmsnorm, siluandmul: FlashInfer's fused kernels when installed, else torch (``F.rms_norm``; SiLU·Mul in
  eager torch, always labelled eager). Whether ``F.rms_norm`` ran as a single fused kernel is read from the
  profiler and written into ``kernel``.
"""
from __future__ import annotations

import math

from .launch import Prepared, Unsupported, first_line, parse_lengths

RMSNORM_EPS = 1e-6
PAGE_SIZE = 256  # FlashAttention-2's paged KV cache needs blocks of a multiple of 256 tokens
FA3_PAGE_SIZE = 16  # vLLM's block size, and the page of Hopper's fa2_paged in the analytical model (fa2.py)


def _module_version(module) -> str:
    return str(getattr(module, "__version__", "") or "")


class TorchRunners:
    """Prepare any grid row on ``device``.

    ``attn_backend``: auto (FA3 on Hopper when installed, else FA2 when installed, else SDPA),
    fa3, fa2 or sdpa. ``elementwise_backend``: auto (FlashInfer when installed, else torch), flashinfer or torch.
    Call :meth:`check_op` before building the grid: it smoke-tests each backend and, in auto mode, falls back
    to the next one (see :attr:`notes`), which fixes the attention_type strings the grid must use.
    """

    def __init__(self, device="cuda", attn_backend: str = "auto", elementwise_backend: str = "auto"):
        import torch

        if attn_backend not in ("auto", "fa3", "fa2", "sdpa"):
            raise ValueError(f"unknown attention backend {attn_backend!r} (auto, fa3, fa2, sdpa)")
        if elementwise_backend not in ("auto", "flashinfer", "torch"):
            raise ValueError(f"unknown element-wise backend {elementwise_backend!r} (auto, flashinfer, torch)")
        self.torch = torch
        self.device = torch.device(device)
        self.is_cuda = self.device.type == "cuda"
        self.attn_forced = attn_backend != "auto"
        self.elementwise_forced = elementwise_backend != "auto"
        self.notes: list[str] = []
        fa2 = self._import("flash_attn") if attn_backend in ("auto", "fa2", "fa3") else None
        fa3 = None
        if attn_backend in ("auto", "fa3") and self.is_cuda and torch.cuda.get_device_capability(self.device)[0] == 9:
            fa3 = self._import("flash_attn_interface")
        if attn_backend == "fa2" and fa2 is None:
            raise ValueError("attention backend fa2: flash_attn is not installed")
        if attn_backend == "fa3" and fa3 is None:
            raise ValueError("attention backend fa3: flash_attn_interface (FlashAttention-3) is not installed "
                             "or this is not a Hopper GPU")
        self.fa2, self.fa3 = fa2, fa3
        self.prefill_backend = "fa3" if fa3 is not None else ("fa2" if fa2 is not None else "sdpa")
        self.decode_backend = "fa3" if fa3 is not None else ("fa2" if fa2 is not None else "sdpa")
        flashinfer = self._import("flashinfer") if elementwise_backend in ("auto", "flashinfer") else None
        if elementwise_backend == "flashinfer" and flashinfer is None:
            raise ValueError("element-wise backend flashinfer: flashinfer is not installed")
        self.flashinfer_version = _module_version(flashinfer) if flashinfer is not None else ""
        self.fi_rmsnorm = self._find(flashinfer, ("rmsnorm", "norm.rmsnorm"))
        self.fi_silu_and_mul = self._find(flashinfer, ("silu_and_mul", "activation.silu_and_mul"))
        self._checked: dict[str, str | None] = {}

    # -- optional libraries ----------------------------------------------------------------------

    def _import(self, name: str):
        if not self.is_cuda:
            return None  # these libraries are CUDA-only
        try:
            return __import__(name)
        except Exception:
            return None

    @staticmethod
    def _find(module, paths):
        if module is None:
            return None
        for path in paths:
            obj = module
            try:
                for part in path.split("."):
                    obj = getattr(obj, part)
                return obj
            except AttributeError:
                continue
        return None

    @property
    def prefill_attention_type(self) -> str:
        return "fa3_ragged" if self.prefill_backend == "fa3" else "fa2_ragged"

    @property
    def decode_attention_type(self) -> str:
        return "fa2_paged"

    def describe_backends(self) -> str:
        fi = f"flashinfer {self.flashinfer_version}".strip()
        norm = fi if self.fi_rmsnorm is not None else "torch"
        act = fi if self.fi_silu_and_mul is not None else "torch"
        return (f"attention prefill: {self.prefill_backend} ({self.prefill_attention_type}), "
                f"decode: {self.decode_backend} ({self.decode_attention_type}); rmsnorm: {norm}; siluandmul: {act}")

    # -- smoke tests -----------------------------------------------------------------------------

    def _smoke(self, op: str, row: dict) -> str | None:
        try:
            prepared = self.prepare(op, row)
            prepared.fn()
            if self.is_cuda:
                self.torch.cuda.synchronize(self.device)
            return None
        except Exception as exc:  # noqa: BLE001 - any failure means "cannot run here"
            return first_line(exc)

    def check_op(self, op: str) -> str | None:
        """Why ``op`` cannot run here at all (None if it can); falls back between backends in auto mode."""
        if op in self._checked:
            return self._checked[op]
        reason = None
        torch = self.torch
        if op == "gemm_fp8":
            if not hasattr(torch, "float8_e4m3fn") or not hasattr(torch, "_scaled_mm"):
                reason = "this torch has no FP8 GEMM (torch._scaled_mm)"
            elif self.is_cuda and torch.cuda.get_device_capability(self.device) < (8, 9):
                reason = "FP8 GEMM needs compute capability 8.9 or newer"
        if reason is None:
            if op in ("gemm", "gemm_fp8"):
                reason = self._smoke(op, {"M": 16, "N": 128, "K": 128})
            elif op == "attn":
                reason = self._check_attention()
            elif op in ("rmsnorm", "siluandmul"):
                attr = "fi_rmsnorm" if op == "rmsnorm" else "fi_silu_and_mul"
                sample = {"seq": 4, "dim": 256}
                reason = self._smoke(op, sample)
                if reason and getattr(self, attr) is not None and not self.elementwise_forced:
                    self.notes.append(f"{op}: flashinfer failed ({reason}); using torch")
                    setattr(self, attr, None)
                    reason = self._smoke(op, sample)
            else:
                reason = f"operator {op!r} has no single-GPU runner"
        self._checked[op] = reason
        return reason

    def _check_attention(self) -> str | None:
        prefill = {"attention_type": "", "bs": 2, "q_lengths": "[64,64]", "kv_lengths": "[64,64]",
                   "nh": 4, "nkv": 2, "hd": 128}
        while True:
            prefill["attention_type"] = self.prefill_attention_type
            reason = self._smoke("attn", prefill)
            if reason is None:
                break
            if self.attn_forced or self.prefill_backend == "sdpa":
                return f"prefill ({self.prefill_backend}): {reason}"
            fallback = "fa2" if (self.prefill_backend == "fa3" and self.fa2 is not None) else "sdpa"
            self.notes.append(f"attention prefill: {self.prefill_backend} failed ({reason}); using {fallback}")
            self.prefill_backend = fallback
        decode = {"attention_type": self.decode_attention_type, "bs": 2, "q_lengths": "[1,1]",
                  "kv_lengths": "[300,300]", "nh": 4, "nkv": 2, "hd": 128}
        while True:
            reason = self._smoke("attn", decode)
            if reason is None:
                return None
            if self.attn_forced or self.decode_backend == "sdpa":
                return f"decode ({self.decode_backend}): {reason}"
            fallback = "fa2" if (self.decode_backend == "fa3" and self.fa2 is not None) else "sdpa"
            self.notes.append(f"attention decode: {self.decode_backend} failed ({reason}); using {fallback}")
            self.decode_backend = fallback

    # -- inputs ----------------------------------------------------------------------------------

    def _randn(self, *shape, scale: float = 1.0):
        t = self.torch.randn(*shape, device=self.device, dtype=self.torch.bfloat16)
        if scale != 1.0:
            t.mul_(scale)
        return t

    # -- runners ---------------------------------------------------------------------------------

    def prepare(self, op: str, row: dict) -> Prepared:
        if op in ("gemm", "gemm_fp8"):
            return self._gemm(int(row["M"]), int(row["N"]), int(row["K"]), fp8=(op == "gemm_fp8"))
        if op == "attn":
            return self._attention(row)
        if op == "rmsnorm":
            return self._rmsnorm(int(row["seq"]), int(row["dim"]))
        if op == "siluandmul":
            return self._siluandmul(int(row["seq"]), int(row["dim"]))
        raise Unsupported(f"operator {op!r} has no single-GPU runner")

    def _gemm(self, M: int, N: int, K: int, fp8: bool) -> Prepared:
        torch = self.torch
        if not fp8:
            x = self._randn(M, K)
            w = self._randn(N, K, scale=1.0 / math.sqrt(K))  # keeps outputs O(1)
            F = torch.nn.functional
            return Prepared(fn=lambda: F.linear(x, w), backend="torch.nn.functional.linear", dtype="bfloat16",
                            keep=[x, w])
        if K % 16 or N % 16:
            raise Unsupported("torch._scaled_mm needs K and N to be multiples of 16")
        a = self._randn(M, K).to(torch.float8_e4m3fn)
        b = self._randn(N, K).to(torch.float8_e4m3fn).t()  # (K, N) column-major, as _scaled_mm requires
        one = torch.ones((), dtype=torch.float32, device=self.device)
        # fast accumulation, as vLLM's per-tensor FP8 linear layers run (CUTLASS; the harness of 8 of the 10 FP8
        # GPUs in the data): without it Hopper's cuBLASLt adds a slower, more precise accumulation path
        return Prepared(
            fn=lambda: torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16,
                                        use_fast_accum=True),
            backend="torch._scaled_mm(e4m3,per-tensor,fast_accum)", dtype="float8_e4m3fn", keep=[a, b, one],
        )

    def _attention(self, row: dict) -> Prepared:
        kind = str(row["attention_type"])
        q_lens = parse_lengths(row["q_lengths"])
        kv_lens = parse_lengths(row["kv_lengths"])
        nh, nkv, hd = int(row["nh"]), int(row["nkv"]), int(row["hd"])
        bs = int(row["bs"])
        if len(q_lens) != bs or len(kv_lens) != bs:
            raise ValueError(f"attention row: bs {bs} but {len(q_lens)} q and {len(kv_lens)} kv lengths")
        if any(q > kv for q, kv in zip(q_lens, kv_lens)) or min(q_lens) < 1:
            raise ValueError("attention row: every q length must be between 1 and its kv length")
        if nh % nkv:
            raise ValueError(f"attention row: nh {nh} is not a multiple of nkv {nkv}")
        decode = kind.endswith("_paged")
        if decode:
            if kind != self.decode_attention_type:
                raise Unsupported(f"{kind}: this run measures decode with {self.decode_attention_type}")
            if self.decode_backend in ("fa3", "fa2"):
                return self._paged_decode(q_lens, kv_lens, nh, nkv, hd)
            return self._sdpa(q_lens, kv_lens, nh, nkv, hd, decode=True)
        if kind != self.prefill_attention_type:
            raise Unsupported(f"{kind}: this run measures prefill with {self.prefill_attention_type}")
        if self.prefill_backend in ("fa3", "fa2"):
            return self._flash_varlen(q_lens, kv_lens, nh, nkv, hd)
        return self._sdpa(q_lens, kv_lens, nh, nkv, hd, decode=False)

    def _cu_seqlens(self, lengths):
        torch = self.torch
        cu = [0]
        for n in lengths:
            cu.append(cu[-1] + n)
        return torch.tensor(cu, dtype=torch.int32, device=self.device)

    def _flash_varlen(self, q_lens, kv_lens, nh, nkv, hd) -> Prepared:
        module = self.fa3 if self.prefill_backend == "fa3" else self.fa2
        q = self._randn(sum(q_lens), nh, hd)
        k = self._randn(sum(kv_lens), nkv, hd)
        v = self._randn(sum(kv_lens), nkv, hd)
        cu_q, cu_k = self._cu_seqlens(q_lens), self._cu_seqlens(kv_lens)
        max_q, max_k = max(q_lens), max(kv_lens)
        func = module.flash_attn_varlen_func

        def fn():
            return func(q, k, v, cu_q, cu_k, max_q, max_k, causal=True)

        name = "flash_attn_interface.flash_attn_varlen_func(FA3)" if module is self.fa3 else \
            "flash_attn.flash_attn_varlen_func(FA2)"
        return Prepared(fn=fn, backend=name, dtype="bfloat16", keep=[q, k, v, cu_q, cu_k])

    def _paged_decode(self, q_lens, kv_lens, nh, nkv, hd) -> Prepared:
        torch = self.torch
        if any(q != 1 for q in q_lens):
            raise Unsupported("paged decode rows must have q length 1")
        fa3 = self.decode_backend == "fa3"
        page = FA3_PAGE_SIZE if fa3 else PAGE_SIZE
        bs = len(kv_lens)
        blocks_per_seq = [math.ceil(kv / page) for kv in kv_lens]
        num_blocks = sum(blocks_per_seq)
        max_blocks = max(blocks_per_seq)
        # Pages of one sequence are scattered over the cache, as in a serving engine.
        order = torch.randperm(num_blocks, device="cpu").to(torch.int32)
        table = torch.zeros(bs, max_blocks, dtype=torch.int32)
        pos = 0
        for i, n in enumerate(blocks_per_seq):
            table[i, :n] = order[pos:pos + n]
            pos += n
        block_table = table.to(self.device)
        k_cache = self._randn(num_blocks, page, nkv, hd)
        v_cache = self._randn(num_blocks, page, nkv, hd)
        q = self._randn(bs, 1, nh, hd)
        seqlens = torch.tensor(kv_lens, dtype=torch.int32, device=self.device)
        if fa3:  # FlashAttention-3 names the block table page_table
            func, table_argument = self.fa3.flash_attn_with_kvcache, "page_table"
            name = f"flash_attn_interface.flash_attn_with_kvcache(FA3,paged,page={page})"
        else:
            func, table_argument = self.fa2.flash_attn_with_kvcache, "block_table"
            name = f"flash_attn.flash_attn_with_kvcache(FA2,paged,page={page})"
        tables = {table_argument: block_table}

        def fn():
            return func(q, k_cache, v_cache, cache_seqlens=seqlens, causal=True, **tables)

        return Prepared(fn=fn, backend=name, dtype="bfloat16", keep=[q, k_cache, v_cache, seqlens, block_table])

    def _sdpa(self, q_lens, kv_lens, nh, nkv, hd, decode: bool) -> Prepared:
        torch = self.torch
        F = torch.nn.functional
        from torch.nn.attention import SDPBackend, sdpa_kernel

        if len(set(q_lens)) != 1 or len(set(kv_lens)) != 1:
            raise Unsupported("torch SDPA (flash backend) runs uniform lengths only; "
                              "install flash-attn for ragged batches")
        bs, lq, lk = len(q_lens), q_lens[0], kv_lens[0]
        if decode and lq != 1:
            raise Unsupported("decode rows must have q length 1")
        if not decode and lq != lk:
            raise Unsupported("torch SDPA aligns the causal mask top-left: prefill rows need q length = kv length")
        # (B, L, H, D) storage viewed as (B, H, L, D), the layout serving engines hand to the kernel.
        q = self._randn(bs, lq, nh, hd).transpose(1, 2)
        k = self._randn(bs, lk, nkv, hd).transpose(1, 2)
        v = self._randn(bs, lk, nkv, hd).transpose(1, 2)
        gqa = nh != nkv
        causal = not decode  # a single query at the end of the sequence sees every key

        def fn():
            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa)

        return Prepared(fn=fn, backend="torch.sdpa(flash backend)", dtype="bfloat16", keep=[q, k, v])

    def _rmsnorm(self, seq: int, dim: int) -> Prepared:
        torch = self.torch
        x = self._randn(seq, dim)
        w = self._randn(dim)
        if self.fi_rmsnorm is not None:
            norm = self.fi_rmsnorm
            out = torch.empty_like(x)
            return Prepared(fn=lambda: norm(x, w, RMSNORM_EPS, out=out), backend="flashinfer rmsnorm",
                            dtype="bfloat16", elementwise=True, fused=True, keep=[x, w, out])
        F = torch.nn.functional
        return Prepared(fn=lambda: F.rms_norm(x, (dim,), w, RMSNORM_EPS), backend="torch.nn.functional.rms_norm",
                        dtype="bfloat16", elementwise=True, fused=None, keep=[x, w])

    def _siluandmul(self, seq: int, dim: int) -> Prepared:
        torch = self.torch
        if dim % 2:
            raise ValueError(f"siluandmul dim is the input width 2·d and must be even, got {dim}")
        d = dim // 2
        x = self._randn(seq, dim)
        if self.fi_silu_and_mul is not None:
            act = self.fi_silu_and_mul
            out = torch.empty(seq, d, dtype=x.dtype, device=self.device)
            return Prepared(fn=lambda: act(x, out=out), backend="flashinfer silu_and_mul",
                            dtype="bfloat16", elementwise=True, fused=True, keep=[x, out])
        F = torch.nn.functional
        gate, up = x[:, :d], x[:, d:]
        # always two kernels (silu, then the product): labelled eager whatever the profiler sees, so that the row
        # never passes for vLLM's fused kernel (without the profiler the label would otherwise say "unknown")
        return Prepared(fn=lambda: F.silu(gate) * up, backend="torch silu(gate)*up", dtype="bfloat16",
                        elementwise=True, fused=False, keep=[x])

    # -- kernel names ----------------------------------------------------------------------------

    def kernel_names(self, fn) -> list[str] | None:
        """Names of the GPU kernels one call launches (None when the profiler is unavailable)."""
        if not self.is_cuda:
            return None
        torch = self.torch
        try:
            from torch.autograd import DeviceType
            from torch.profiler import ProfilerActivity, profile

            torch.cuda.synchronize(self.device)
            with torch.no_grad(), profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                fn()
                torch.cuda.synchronize(self.device)
            names = []
            for event in prof.events():
                if event.device_type != DeviceType.CUDA:
                    continue
                name = event.name
                if name.startswith(("Memset", "Memcpy", "cudaMem")):
                    continue
                names.append(name)
            return names
        except Exception:
            return None
