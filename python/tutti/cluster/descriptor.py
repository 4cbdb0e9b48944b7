"""The location descriptor: what the cluster index holds for one block key.

One small Mooncake object per (model, TP rank, block): the node that holds the block, its store, the
slot, the slot's generation and the data checksum its commit recorded.  A value read back from Mooncake
is checked before anything is done with it (magic, version, exact length, a check over the fields, the
model, the geometry); a value that fails is a miss, never a guess.  The check only catches torn, stale-
format or foreign values: what makes a fetched block safe is that its bytes match ``data_sum`` (the
owner's own record) when they arrive.

Layout (little-endian): "TTCD", u16 version, u16 endpoint length, fingerprint id[16], store key[16],
store uuid[16], u64 slot, gen, data_sum, block_bytes, u32 span_bytes, n_objs, endpoint (UTF-8),
then 8 bytes: the first half of XXH3-128 (libtutti's key hash) of everything before them.
"""
from __future__ import annotations

import struct
import uuid as _uuid
from dataclasses import dataclass

from .. import _binding
from .._cconv import key_from_bytes
from .errors import DescriptorError

MAGIC = b"TTCD"
VERSION = 1
MAX_ENDPOINT = 255
_HEAD = struct.Struct("<4sHH16s16s16sQQQQII")
_CHECK = 8


def _check_of(data: bytes) -> bytes:
    return key_from_bytes(_binding.EXTENSION, data)[:_CHECK]


@dataclass(frozen=True)
class Descriptor:
    fp_id: bytes        # fingerprint id (tutti.cluster.keys.fingerprint_id): model, geometry, TP rank
    key: bytes          # the 16-byte store key
    store_uuid: str
    endpoint: str       # the owner's transfer endpoint, "host:port" (its node id)
    slot: int
    gen: int
    data_sum: int
    block_bytes: int
    span_bytes: int
    n_objs: int

    def encode(self) -> bytes:
        ep = self.endpoint.encode()
        if len(ep) > MAX_ENDPOINT:
            raise DescriptorError(f"endpoint longer than {MAX_ENDPOINT} bytes")
        head = _HEAD.pack(MAGIC, VERSION, len(ep), self.fp_id, self.key, _uuid.UUID(self.store_uuid).bytes,
                          self.slot, self.gen, self.data_sum, self.block_bytes, self.span_bytes,
                          self.n_objs)
        body = head + ep
        return body + _check_of(body)

    @classmethod
    def decode(cls, value) -> "Descriptor":
        """The descriptor in ``value``; DescriptorError names what is wrong with it."""
        value = bytes(value)
        if len(value) < _HEAD.size + _CHECK:
            raise DescriptorError(f"descriptor of {len(value)} bytes is shorter than its header")
        (magic, version, ep_len, fp_id, key, uuid_b, slot, gen, data_sum, block_bytes, span_bytes,
         n_objs) = _HEAD.unpack_from(value)
        if magic != MAGIC:
            raise DescriptorError(f"not a tutti location descriptor (magic {magic!r})")
        if version != VERSION:
            raise DescriptorError(f"descriptor version {version}; this tutti reads version {VERSION}")
        if len(value) != _HEAD.size + ep_len + _CHECK:
            raise DescriptorError(f"descriptor is {len(value)} bytes; its header says "
                                  f"{_HEAD.size + ep_len + _CHECK}")
        body = value[:-_CHECK]
        if _check_of(body) != value[-_CHECK:]:
            raise DescriptorError("descriptor fails its check (torn or altered)")
        try:
            endpoint = body[_HEAD.size:].decode()
        except UnicodeDecodeError:
            raise DescriptorError("descriptor endpoint is not UTF-8") from None
        if n_objs == 0 or span_bytes == 0 or block_bytes != span_bytes * n_objs:
            raise DescriptorError(f"descriptor geometry is inconsistent ({n_objs} objects of "
                                  f"{span_bytes} bytes in a {block_bytes}-byte block)")
        return cls(fp_id=fp_id, key=key, store_uuid=str(_uuid.UUID(bytes=uuid_b)), endpoint=endpoint,
                   slot=slot, gen=gen, data_sum=data_sum, block_bytes=block_bytes,
                   span_bytes=span_bytes, n_objs=n_objs)

    def check_against(self, fp_id: bytes, key: bytes, geometry) -> None:
        """Refuse a descriptor for another model/rank, another key, or a block shaped unlike ours."""
        if self.fp_id != fp_id:
            raise DescriptorError("descriptor is for another model or TP rank")
        if self.key != key:
            raise DescriptorError("descriptor names another block key")
        n_objs = geometry.n_layers * geometry.n_spans
        if (self.span_bytes, self.n_objs) != (geometry.span_bytes, n_objs):
            raise DescriptorError(f"descriptor block is {self.n_objs} x {self.span_bytes} bytes; this "
                                  f"store's is {n_objs} x {geometry.span_bytes}")
