"""The pass's side of the attention store: `LayerStream` takes each layer's probabilities as the forward pass
produces them, reduces what needs every map (the mean attention distance's sums), writes a spill's head-fused
planes (`fused_planes`), records the queries and keys and checks that they rebuild the model's maps, and
copies the compact `attention_store.AttentionStore` to the host once at the end.
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Iterator

import numpy as np
import torch

from vit_inspect.analysis.attention_distance import patch_distances
from vit_inspect.core.errors import CaptureError
from vit_inspect.core.families import adapter_of
from vit_inspect.core.handle import ViTHandle
from vit_inspect.core.tokens import TokenLayout
from vit_inspect.passes.attention_store import TOLERANCE, AttentionStore
from vit_inspect.passes.host_copy import to_host
from vit_inspect.passes.spill import Spill

ROWS_CHECKED = 16  # rows per layer compared with the model's own probabilities during the pass
CHECK_BYTES = 32 * 2 ** 20  # layers whose Q/K check waits to run batched hold at most about this much
# Patch-to-patch entries of a layer (or block of rows) from which its distance sums are one batched product
# (`_distance_sums_of`; bench/bench_distance_sums.py, 2 CPU threads): below it, DeiT-Ti's 3 x 196^2, the
# elementwise product is a little faster; from ViT-B/16's 12 x 196^2 up the batched product takes less time
# (0.77 of the elementwise time there, 0.52 for a block of DINOv2-L/14's rows at 518, 0.12 for a whole layer)
BATCHED_DISTANCE_ENTRIES = 2 ** 18


def fused_planes(maps: torch.Tensor) -> dict[str, np.ndarray]:
    """The `spill.PLANES` of one layer's (heads, N, N) probabilities, on the host: their float32 sum over heads
    (one matrix-vector product with a vector of ones: a single read of the maps, no temporary of their size),
    and their maximum and minimum over heads rounded to float16 by torch (as numpy rounds)."""
    flat = maps.float().reshape(maps.shape[0], -1)  # (heads, N^2), a view for float32 maps
    ones = torch.ones(1, maps.shape[0], dtype=flat.dtype, device=flat.device)
    return {"sum": (ones @ flat).reshape(maps.shape[1:]).cpu().numpy(),
            "max": maps.amax(0).to(torch.float16).cpu().numpy(),
            "min": maps.amin(0).to(torch.float16).cpu().numpy()}


@dataclass(eq=False)
class _Pending:
    """One layer waiting for `LayerStream._flush`: its maps (for the fallback), Q and K of image 0 as the model
    made them and the sampled rows of its maps (None when Q/K were not recorded or the maps are not
    (B, heads, N, N)), all on the model's device."""

    layer: int
    maps: torch.Tensor | None  # (heads, N, N) as the model produced them; None for a layer given by rows
    queries: torch.Tensor | None = None  # (heads, N, d) in the model's dtype
    keys: torch.Tensor | None = None
    real: torch.Tensor | None = None  # (heads, n, N) float32 sampled rows

    def nbytes(self, held_by_autograd: bool = False) -> int:
        """Bytes it keeps alive, or with gradients (the backward keeps the maps, Q and K anyway) the bytes
        the check will copy: Q, K and the sampled rows."""
        held = (self.queries, self.keys, self.real) if held_by_autograd else (self.maps, self.queries, self.keys,
                                                                             self.real)
        return sum(t.untyped_storage().nbytes() for t in held if t is not None)


@dataclass(eq=False)
class _RowParts:
    """What `LayerStream.on_rows` has taken of one layer so far: per block of patch query rows its distance
    sums, the spill's (N, N) planes filled row by row (None without a spill), and the sampled rows."""

    distance: list = field(default_factory=list)  # ((heads, p) sums, (heads, p) masses) per block
    planes: dict | None = None  # name -> (N, N) host tensor (`spill.PLANES`)
    real: list = field(default_factory=list)  # (heads, n_b, N) float32 sampled rows per block


def _rebuild_errors(queries: torch.Tensor, keys: torch.Tensor, scale: torch.Tensor, real: torch.Tensor,
                    sample: torch.Tensor) -> torch.Tensor:
    """(L,) max |softmax(s_l * q kᵀ) - recorded| over the sampled rows of L layers of one shape, computed in
    float32 from (L, heads, N, d) queries and keys already rounded to the stored dtype, (L,) scales s_l
    and (L, heads, n, N) recorded rows."""
    chosen = queries.index_select(2, sample).float()  # (L, heads, n, d)
    scores = torch.matmul(chosen, keys.float().transpose(-1, -2))  # (L, heads, n, N)
    rebuilt = torch.softmax(scores * scale.to(scores.dtype).view(-1, 1, 1, 1), dim=-1)
    return (rebuilt - real).abs().amax(dim=(1, 2, 3))


class LayerStream:
    """Consumes each layer's probabilities as the forward pass produces them, then lets them go.

    Per layer: records Q and K (hooks), checks a sample of rebuilt rows against the real probabilities,
    and reduces the maps to each query's distance sums for the mean attention distance (`distances_per_image`),
    finished for every layer at once by `mean_distance`. Only one layer's float32 maps are alive at a time,
    so the pass never holds depth x heads x N^2 float32 values (with ``keep_maps``, a small model's float16
    maps of every layer, `keeps_maps`).

    Everything stays on the model's device until `store` copies the result to the host once, already compact
    (`host_copy.to_host`: a large copy from a CUDA device goes through page-locked memory):
    no layer crosses to the host on its own. The check's verdicts are the only values read back before then,
    a few numbers per `_flush`. ``held_by_autograd`` (a pass with gradients, whose backward keeps every
    layer's maps, Q and K anyway) counts only what the check copies (Q, K, sampled rows) toward CHECK_BYTES,
    so such a pass checks several layers at a time even where one layer's maps pass the bound.
    """

    def __init__(self, handle: ViTHandle, layout: TokenLayout, tolerance: float = TOLERANCE,
                 spill: Spill | None = None, keep_maps: bool = False, held_by_autograd: bool = False):
        self.handle = handle
        self.layout = layout
        self.tolerance = tolerance
        self.spill = spill  # each layer's maps of image 0 are written there too, their heads fused (`spill.PLANES`)
        self.depth = handle.depth
        # `keeps_maps`: every layer's maps of image 0 go into one float16 array, no Q/K is recorded or checked
        self.keep_maps = keep_maps
        self.held_by_autograd = held_by_autograd
        self._kept: torch.Tensor | None = None  # (depth, heads, N, N) float16 on the maps' device, made on the first layer
        self._kept_layers: set[int] = set()
        # the query and key modules each layer's Q/K are recorded from (none when the maps themselves are kept)
        adapter = adapter_of(handle)
        self.modules = [None] * self.depth if keep_maps else [adapter.query_key_modules(a)
                                                              for a in handle.attention_modules]
        self._q: dict[int, torch.Tensor] = {}
        self._k: dict[int, torch.Tensor] = {}
        # per layer, on the model's device: Q and K rounded to the dtype that passed the check, or the float16
        # maps of a layer that failed it
        self.queries: list[torch.Tensor | None] = [None] * self.depth
        self.keys: list[torch.Tensor | None] = [None] * self.depth
        self.maps: list[torch.Tensor | None] = [None] * self.depth  # kept only for layers that failed the check
        # (2, depth, heads, N, d) float16 on the device, made on the first layer that passes in float16: every
        # such layer's Q and K are written into it, so `store` copies it to the host as is, with no stacked
        # copy beside the layers' own on the device (135 MB for DINOv2-L/14 at 518; on an H100 the peak of
        # ViT-L/16 at 384's pass fell 32 MB without it)
        self._qk16: torch.Tensor | None = None
        self._in_qk16: set[int] = set()
        self.errors = np.zeros(self.depth)
        # per layer, image 0: sum_j a_ij d_ij and sum_j a_ij over patch keys j, (heads, P) float32 each
        self._distance_sums: list[tuple[torch.Tensor, torch.Tensor] | None] = [None] * self.depth
        self._distances: torch.Tensor | None = None  # (P, P) float32 pixels, made on the first layer
        self._distance_rows: torch.Tensor | None = None  # (P, 2, P) float32: query i's d_ij over keys j, then ones
        self._pending: list[_Pending] = []  # layers whose check waits for `_flush`
        self._pending_bytes = 0
        self._samples: dict[tuple, torch.Tensor] = {}  # (N, device) -> the rows the check compares
        self._rows: dict[int, _RowParts] = {}  # layers given a block of rows at a time (`on_rows`), unfinished

    def _record(self, into: dict, layer: int, tensor: object, shape: str) -> None:
        """Keep a (B, heads, N, d) view of a query/key output; anything else is left out (maps fallback)."""
        if not isinstance(tensor, torch.Tensor):
            return
        tensor = tensor.detach()
        if shape != "bhnd":
            heads = int(shape.split(":")[1])
            if tensor.ndim != 3 or tensor.shape[-1] % heads:
                return
            tensor = tensor.reshape(tensor.shape[0], tensor.shape[1], heads, -1).transpose(1, 2)
        if tensor.ndim == 4:
            into[layer] = tensor

    @contextmanager
    def hooks(self) -> Iterator["LayerStream"]:
        """Forward hooks on every layer's query and key modules, removed on leaving."""
        handles = []
        try:
            for i, found in enumerate(self.modules):
                if found is None or self.keep_maps:
                    continue
                q_module, k_module, shape, _ = found
                handles.append(q_module.register_forward_hook(
                    lambda m, a, out, i=i, s=shape: self._record(self._q, i, out, s)))
                handles.append(k_module.register_forward_hook(
                    lambda m, a, out, i=i, s=shape: self._record(self._k, i, out, s)))
            yield self
        finally:
            for h in handles:
                h.remove()

    def on_attention(self, layer: int, probs: torch.Tensor) -> None:
        """Called with (B, heads, N, N) probabilities of `layer` (image 0 is kept and reduced).

        Its distance sums are taken now. With ``keep_maps`` its maps are copied, rounded to float16, into the
        store's array, and that is all. Otherwise the check of Q and K waits in `_pending` (this layer's float32 Q
        and K, the sampled rows of its maps and a reference to the maps for the fallback) until those hold
        CHECK_BYTES, then runs for every waiting layer at once (`_flush`): a few batched products instead
        of a dozen small ones per layer. A layer whose maps alone pass the bound is checked at once, so
        the pass never holds more than one layer's maps beyond the bound."""
        probs = probs.detach()
        self._distance_sums[layer] = self._distance_sums_of(probs[0].float())
        if self.keep_maps:
            if self._kept is None:  # on the host directly when the model runs there: `store` then copies nothing
                self._kept = torch.empty((self.depth, *probs.shape[1:]), dtype=torch.float16, device=probs.device)
            self._kept[layer].copy_(probs[0])  # rounded to float16 by torch, as numpy rounds
            self._kept_layers.add(layer)
            return
        if self.spill is not None and probs.ndim == 4 and tuple(probs.shape[2:]) == self.spill.shape[1:]:
            self.spill.write(layer, fused_planes(probs[0]))
        q, k = self._q.pop(layer, None), self._k.pop(layer, None)
        found = self.modules[layer]
        maps = probs[0]  # (heads, N, N), what the maps fallback keeps (a view: no copy)
        entry = _Pending(layer, maps)
        if q is not None and k is not None and found is not None and probs.ndim == 4:
            entry.queries, entry.keys = q[0], k[0]  # (heads, N, d), on the device, no copy
            entry.real = maps.index_select(1, self._sample(maps.shape[-1], maps.device)).float()  # (heads, n, N)
        self._pending.append(entry)
        self._pending_bytes += entry.nbytes(self.held_by_autograd)
        if self._pending_bytes >= CHECK_BYTES:
            self._flush()

    def on_rows(self, layer: int, start: int, block: torch.Tensor) -> None:
        """`on_attention` a block of query rows at a time (`capture.blocked_attention`): (heads, b, N)
        probabilities of rows start .. start + b - 1 of image 0. The block's share of the distance sums, of
        the spill's planes and of the check's sampled rows is taken now, while the block is in the cache;
        `on_layer_done` finishes the layer as `on_attention` would (never with ``keep_maps``)."""
        block = block.detach().float()
        heads, rows, num_tokens = block.shape
        parts = self._rows.get(layer)
        if parts is None:
            parts = self._rows[layer] = _RowParts()
            if self.spill is not None and (num_tokens, num_tokens) == tuple(self.spill.shape[1:]):
                parts.planes = {"sum": torch.empty((num_tokens, num_tokens), dtype=torch.float32),
                                "max": torch.empty((num_tokens, num_tokens), dtype=torch.float16),
                                "min": torch.empty((num_tokens, num_tokens), dtype=torch.float16)}
        patch = self.layout.patch_slice
        first, last = max(start, patch.start), min(start + rows, patch.stop)  # the block's patch query rows
        if first < last:
            parts.distance.append(self._distance_sums_of(block[:, first - start:last - start], first - patch.start))
        if parts.planes is not None:  # `fused_planes` of the rows, written into the layer's planes in place
            planes = parts.planes
            ones = torch.ones(1, heads, dtype=block.dtype, device=block.device)
            torch.matmul(ones, block.reshape(heads, -1), out=planes["sum"][start:start + rows].view(1, -1))
            planes["max"][start:start + rows].copy_(block.amax(0))  # rounded to float16 by torch, as `.to` rounds
            planes["min"][start:start + rows].copy_(block.amin(0))
        sample = self._sample(num_tokens, block.device)
        chosen = sample[(sample >= start) & (sample < start + rows)]
        if len(chosen):
            parts.real.append(block.index_select(1, chosen - start))

    def on_layer_done(self, layer: int) -> None:
        """Finish a layer given by `on_rows`: its distance sums, its spill's planes, and its check waiting in
        `_pending` with no maps (a layer the check fails is rebuilt from its float32 Q and K, `_flush`)."""
        parts = self._rows.pop(layer)
        self._distance_sums[layer] = (torch.cat([sums for sums, _ in parts.distance], dim=-1),
                                      torch.cat([mass for _, mass in parts.distance], dim=-1))
        if parts.planes is not None:
            self.spill.write(layer, {name: plane.numpy() for name, plane in parts.planes.items()})
        q, k = self._q.pop(layer, None), self._k.pop(layer, None)
        if q is None or k is None or self.modules[layer] is None:
            raise CaptureError(f"Layer {layer} gave its attention by rows without its queries and keys.")
        entry = _Pending(layer, None, q[0], k[0], torch.cat(parts.real, dim=1))
        self._pending.append(entry)
        self._pending_bytes += entry.nbytes(self.held_by_autograd)
        if self._pending_bytes >= CHECK_BYTES:
            self._flush()

    def _sample(self, num_tokens: int, device: torch.device) -> torch.Tensor:
        """The (n,) query rows compared: ROWS_CHECKED evenly spaced, first and last included."""
        key = (num_tokens, str(device))
        if key not in self._samples:
            self._samples[key] = torch.from_numpy(
                np.unique(np.linspace(0, num_tokens - 1, min(ROWS_CHECKED, num_tokens)).astype(np.int64))).to(device)
        return self._samples[key]

    def _flush(self) -> None:
        """Check every waiting layer: its Q and K in float16, else float32, rebuild the sampled rows within
        the tolerance (`_check`; layers of one shape are checked together, on the model's device, float32 only
        for those float16 failed); a layer neither reproduces keeps its maps in float16. One small copy per
        group of layers and dtype tried brings the verdicts to the host."""
        pending, self._pending, self._pending_bytes = self._pending, [], 0
        groups: dict[tuple, list[_Pending]] = {}
        for entry in pending:
            if entry.real is not None and entry.queries.shape == entry.keys.shape \
                    and entry.queries.shape[0] == entry.real.shape[0] and entry.queries.shape[1] == entry.real.shape[-1]:
                groups.setdefault((entry.queries.shape, entry.real.shape), []).append(entry)
            # otherwise: no Q/K recorded, or Q/K that do not match the maps' heads and tokens: keep the maps
        passed: set[int] = set()
        for group in groups.values():
            # float16 first; float32 only for the layers float16 cannot carry (rare: one more small copy then)
            for dtype in (torch.float16, torch.float32):
                group = [entry for entry in group if entry.layer not in passed]
                if not group:
                    break
                self._check(group, dtype, passed)
        for entry in pending:
            if entry.layer not in passed:
                maps = entry.maps if entry.maps is not None else torch.softmax(  # a layer given by rows
                    self.modules[entry.layer][3] * (entry.queries.float() @ entry.keys.float().transpose(-1, -2)),
                    dim=-1)
                self.maps[entry.layer] = maps.to(torch.float16)  # rounded once by torch, on the device

    def _check(self, group: list[_Pending], dtype: torch.dtype, passed: set[int]) -> None:
        """Check layers of one shape with Q and K rounded to ``dtype``: the errors of their rebuilt rows
        (`_rebuild_errors`) and whether the dtype's range carries the values (float16 overflows past 65504;
        NaN fails too), computed on the device and read back together as one (2, L) float64 array. A layer
        within the tolerance keeps its rounded Q and K and joins ``passed``."""
        queries = torch.stack([e.queries for e in group]).to(dtype)  # (L, heads, N, d)
        keys = torch.stack([e.keys for e in group]).to(dtype)
        largest = torch.stack([torch.maximum(e.queries.abs().amax(), e.keys.abs().amax()) for e in group]).float()
        scale = torch.tensor([self.modules[e.layer][3] for e in group], device=queries.device)  # (L,)
        real = torch.stack([e.real for e in group])  # (L, heads, n, N)
        sample = self._sample(real.shape[-1], real.device)
        verdicts = torch.stack([_rebuild_errors(queries, keys, scale, real, sample).double(),
                                (largest <= torch.finfo(dtype).max).double()]).cpu().numpy()  # (2, L)
        for i, entry in enumerate(group):
            error, fits = verdicts[0, i], verdicts[1, i]
            if not fits:
                continue
            self.errors[entry.layer] = error
            if error <= self.tolerance:
                passed.add(entry.layer)
                self.queries[entry.layer], self.keys[entry.layer] = self._keep(entry.layer, queries[i], keys[i])

    def _keep(self, layer: int, queries: torch.Tensor, keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """A passed layer's rounded Q and K as kept: float16 ones copied into `_qk16` (views of it returned),
        others (float32, or a shape the buffer does not have) as given."""
        if queries.dtype != torch.float16:
            return queries, keys
        if self._qk16 is None:
            self._qk16 = torch.empty((2, self.depth, *queries.shape), dtype=torch.float16, device=queries.device)
        if tuple(self._qk16.shape[2:]) != tuple(queries.shape) or self._qk16.device != queries.device:
            return queries, keys
        self._qk16[0, layer].copy_(queries)
        self._qk16[1, layer].copy_(keys)
        self._in_qk16.add(layer)
        return self._qk16[0, layer], self._qk16[1, layer]

    def _distance_sums_of(self, maps: torch.Tensor, first: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(heads, N, N) float32 probabilities -> ((heads, P) sum_j a_ij d_ij, (heads, P) sum_j a_ij) over patch
        queries i and patch keys j, d in pixels: float32 products and sums, on the maps' device; `mean_distance`
        finishes them in float64. No float64 copy of the maps, no sync per layer. With ``first``, ``maps`` are
        (heads, p, N): the rows of patch queries first .. first + p - 1 only (`on_rows`)."""
        patch = self.layout.patch_slice
        patch_to_patch = maps[..., patch, patch] if first is None else maps[..., patch]  # (heads, P or p, P), a view
        if self._distances is None:
            self._distances = torch.tensor(patch_distances(self.layout), dtype=torch.float32, device=maps.device)
        rows = slice(None) if first is None else slice(first, first + maps.shape[1])
        if patch_to_patch.numel() >= BATCHED_DISTANCE_ENTRIES:
            if self._distance_rows is None:
                self._distance_rows = torch.stack([self._distances, torch.ones_like(self._distances)], dim=1)
            # per query i, one (2, P) x (P, heads) product: [d_i; 1] against the maps' rows a_hi: (read in
            # place, no copy: BLAS takes them transposed), so both sums come from one read of the maps and no
            # temporary of their size (an einsum "hij,ij->hi" copies the maps into its batch order first).
            # In float32 even inside a pass under autocast, which would run a batched product in half precision
            with torch.autocast(maps.device.type, enabled=False):
                both = torch.bmm(self._distance_rows[rows], patch_to_patch.permute(1, 2, 0))  # (P or p, 2, heads)
            return both[:, 0].T, both[:, 1].T
        # small maps: the elementwise product and sums, in the cache (DeiT-Ti at 224: 0.04 ms a layer)
        return (patch_to_patch * self._distances[rows]).sum(-1), patch_to_patch.sum(-1)

    def mean_distance(self) -> np.ndarray:
        """(depth, heads) mean attention distance in pixels of image 0: `distances_per_image` (renormalised over
        patch keys) from each layer's sums, the division and the mean over queries in float64."""
        missing = [i for i, sums in enumerate(self._distance_sums) if sums is None]
        if missing:
            raise CaptureError(f"No attention was recorded for layer(s) {missing}: cannot give the mean distance.")
        per_query = torch.stack([sums[0] for sums in self._distance_sums]).double()  # (depth, heads, P)
        mass = torch.stack([sums[1] for sums in self._distance_sums]).double()
        if bool((mass <= 0).any()):
            raise ValueError("a patch query puts no attention on patch keys; cannot renormalise over patches")
        return (per_query / mass).mean(-1).cpu().numpy()

    def store(self) -> AttentionStore:
        """The compact store, copied to the host at once: float16 Q/K when every layer passed, float32 Q/K
        when some needed it, the float16 maps when any layer could not be rebuilt at all. A spill the stream
        wrote goes with Q/K stores (`AttentionStore.spill`) and is dropped with the maps fallback. With
        ``keep_maps``, the maps as recorded."""
        if self.keep_maps:
            missing = sorted(set(range(self.depth)) - self._kept_layers)
            if missing:
                raise CaptureError(
                    f"No attention was recorded for layer(s) {missing} (of layers 0 to {self.depth - 1}).")
            kept, self._kept = to_host(self._kept).numpy(), None
            return AttentionStore("maps", None, None, None, kept, 0.0)
        self._flush()
        max_error = float(self.errors.max()) if self.depth else 0.0
        if any(m is not None for m in self.maps) or any(q is None for q in self.queries):
            if self.spill is not None:  # the maps are kept in memory: no spill needed
                self.spill.discard()
            maps = [m if m is not None else torch.softmax(
                        float(self.modules[i][3]) * (self.queries[i].float() @ self.keys[i].float().transpose(-1, -2)),
                        dim=-1).to(torch.float16)
                    for i, m in enumerate(self.maps)]
            stacked = to_host(torch.stack(maps)).numpy()
            self.queries, self.keys, self.maps = [None] * self.depth, [None] * self.depth, [None] * self.depth
            self._qk16, self._in_qk16 = None, set()
            return AttentionStore("maps", None, None, None, stacked, max_error)
        half = all(q.dtype == torch.float16 for q in self.queries)
        dtype = torch.float16 if half else torch.float32
        scale = np.array([found[3] for found in self.modules], dtype=np.float64)
        spill = self.spill if self.spill is not None and self.spill.finish() else None  # all layers written
        if half and len(self._in_qk16) == self.depth:  # every layer already in one device array: copied as is
            both = to_host(self._qk16).numpy()
            queries, keys = both[0], both[1]
        else:
            queries = to_host(torch.stack(self.queries).to(dtype)).numpy()
            keys = to_host(torch.stack(self.keys).to(dtype)).numpy()
        # the device copies go before the backward
        self.queries, self.keys, self._qk16, self._in_qk16 = [None] * self.depth, [None] * self.depth, None, set()
        return AttentionStore("qk16" if half else "qk32", queries, keys, scale, None, max_error, spill)
