"""From vLLM's KV cache tensors to a libtutti memory map, by strides alone.

vLLM hands the connector one tensor per attention layer.  Its shape and
strides differ between attention backends (CPU: ``[num_blocks, heads, ...]``
with a block of a layer one contiguous span; flash-attn:
``[2, num_blocks, block_size, heads, dim]`` with K and V two spans).  We find
the block dimension, check that everything inside one block of one span is
dense, and turn every index of the outer dimensions into one span:

    object (layer, span) of block b  =  base[layer, span] + b * block_stride

No layout is assumed, so a backend that permutes its dimensions still works
(or is refused with a reason).
"""
import itertools
from dataclasses import dataclass, field

from ..errors import LayoutError


@dataclass(frozen=True)
class LayerLayout:
    bases: tuple         # byte address of block 0 of each span
    block_stride: int    # bytes from one block to the next
    span_bytes: int


@dataclass(frozen=True)
class KVLayout:
    """Every layer's spans; layers in model order, deduplicated by storage."""

    layer_names: tuple   # one per stored layer
    name_to_layer: dict  # every vLLM layer name -> stored layer index
    layers: tuple        # LayerLayout per stored layer
    n_spans: int
    span_bytes: int
    num_blocks: int
    device: str
    # The tensors the addresses point into: whoever holds the layout keeps them alive (a caller that
    # dropped its own references would otherwise leave the store reading and writing freed memory).
    owners: tuple = field(default=(), repr=False, compare=False)

    @property
    def n_layers(self):
        return len(self.layers)

    @property
    def block_bytes(self):
        return self.n_layers * self.n_spans * self.span_bytes

    def object_map(self):
        """(bases, strides) per (layer, span) in the store's object order: object i of block b is at
        ``bases[i] + b * strides[i]`` (a tt_memmap's arrays)."""
        bases, strides = [], []
        for lay in self.layers:
            bases += lay.bases
            strides += [lay.block_stride] * len(lay.bases)
        return bases, strides


def layer_layout(shape, strides, elem_size, data_ptr, num_blocks) -> LayerLayout:
    """Spans of one layer's tensor (shape and strides in elements)."""
    shape, strides = tuple(shape), tuple(strides)
    if len(shape) != len(strides):
        raise LayoutError("shape and strides differ in length")
    candidates = [d for d, n in enumerate(shape) if n == num_blocks]
    errors = []
    for bd in candidates:
        try:
            return _with_block_dim(shape, strides, elem_size, data_ptr, bd)
        except LayoutError as e:
            errors.append(f"dim {bd}: {e}")
    raise LayoutError(f"no usable block dimension of size {num_blocks} in shape {shape} "
                      f"strides {strides}" + (f" ({'; '.join(errors)})" if errors else ""))


def _with_block_dim(shape, strides, elem, ptr, bd):
    bstride = strides[bd]
    inner = [(strides[d], shape[d]) for d in range(len(shape)) if d != bd and strides[d] < bstride]
    outer = [(strides[d], shape[d]) for d in range(len(shape)) if d != bd and strides[d] >= bstride]
    # Inside one block of one span: dense, innermost stride 1 (size-1 dims do not matter).
    expect = 1
    for st, n in sorted((x for x in inner if x[1] > 1)):
        if st != expect:
            raise LayoutError(f"elements of a block are not dense (stride {st}, expected {expect})")
        expect *= n
    span_elems = expect
    if span_elems > bstride:
        raise LayoutError("a block overlaps the next one")
    spans = []
    for idx in itertools.product(*(range(n) for _, n in outer)):
        spans.append(ptr + sum(i * st for i, (st, _) in zip(idx, outer)) * elem)
    # Spans must not overlap any block of another span.
    bases = sorted(spans)
    for a, b in zip(bases, bases[1:]):
        if b - a < span_elems * elem and b - a < bstride * elem:
            raise LayoutError("spans overlap")
    return LayerLayout(bases=tuple(spans), block_stride=bstride * elem, span_bytes=span_elems * elem)


def _layer_index(name, fallback):
    try:
        from vllm.model_executor.models.utils import extract_layer_index
        return extract_layer_index(name)
    except Exception:  # noqa: BLE001 - any name the helper cannot parse keeps dict order
        return fallback


def from_kv_caches(kv_caches: dict, num_blocks: int) -> KVLayout:
    """Layout of ``register_kv_caches``' tensors (dict of layer name -> tensor)."""
    if not kv_caches:
        raise LayoutError("no KV cache tensors")
    order = sorted(enumerate(kv_caches.items()), key=lambda x: (_layer_index(x[1][0], x[0]), x[0]))
    by_ptr: dict = {}
    names: list = []
    layers: list = []
    name_to_layer: dict = {}
    device = None
    for _, (name, t) in order:
        if isinstance(t, (list, tuple)):
            raise LayoutError(f"layer {name}: a list of tensors per layer is not supported")
        device = device or str(t.device)
        key = (t.data_ptr(), tuple(t.shape), tuple(t.stride()))
        if key in by_ptr:  # layers sharing one KV cache (kv sharing) are one stored layer
            name_to_layer[name] = by_ptr[key]
            continue
        lay = layer_layout(t.shape, t.stride(), t.element_size(), t.data_ptr(), num_blocks)
        by_ptr[key] = len(layers)
        name_to_layer[name] = len(layers)
        names.append(name)
        layers.append(lay)
    n_spans = {len(l.bases) for l in layers}
    span_bytes = {l.span_bytes for l in layers}
    if len(n_spans) != 1 or len(span_bytes) != 1:
        raise LayoutError(f"layers differ in spans per block ({sorted(n_spans)}) or span size "
                          f"({sorted(span_bytes)}): one store cannot hold them")
    return KVLayout(layer_names=tuple(names), name_to_layer=name_to_layer, layers=tuple(layers),
                    n_spans=n_spans.pop(), span_bytes=span_bytes.pop(), num_blocks=num_blocks,
                    device=str(device), owners=tuple(t for _, (_, t) in order))


class MemMap:
    """A ``struct tt_memmap`` over a KVLayout (host memory); keeps its arrays alive."""

    def __init__(self, layout: KVLayout):
        from .._tutti import ffi
        bases, strides = layout.object_map()
        self._layout = layout  # and through it the tensors the addresses point into
        self._base = ffi.new("uint64_t[]", bases)
        self._stride = ffi.new("uint64_t[]", strides)
        self.memmap = ffi.new("struct tt_memmap *")
        self.memmap.n_layers = layout.n_layers
        self.memmap.n_spans = layout.n_spans
        self.memmap.base = self._base
        self.memmap.stride = self._stride
        self.n_blocks = layout.num_blocks
