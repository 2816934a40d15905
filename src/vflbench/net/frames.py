"""Frames: how one message crosses the wire, and the checks a received frame must pass.

A frame is ``magic | version | header length | msgpack header | raw tensor buffers``::

    b"VFLB"  u8 version  u32 header length (little-endian)  header  ids buffer  tensor buffers...

The header is a msgpack map with exactly these keys: ``type`` (``message``, or the control
frames ``hello``, ``ready``, ``abort`` and ``bye``), ``kind``, ``receiver``, ``run``, ``epoch``, ``step``,
``phase``, ``role``, ``call`` (the caller's number of a request, echoed by its reply), ``meta``
(a flat map of scalars), ``ids`` and ``tensors`` (per tensor its ``dtype``, ``shape`` and
``nbytes``). Buffers are the tensors' bytes in little-endian order, back to back.

There is no sender field: the receiver takes the sender from the authenticated connection.

:func:`decode` checks everything before it builds a tensor -- the magic and version, the header's
schema and the type of every value, the dtype against an allow-list, each shape against its byte
count, the sum of the byte counts against the frame's length and the frame against a size limit --
and raises :class:`~vflbench.net.errors.ProtocolError` naming what was wrong. Nothing in this module
(or anywhere on the network path) unpickles: headers are msgpack without extension types, tensors
are built from raw buffers.

A bundle carries several frames in one unit on the wire (one gRPC message), so that a one-way message and the
request or reply that follows it on the same link travel together (:func:`encode_bundle`)::

    b"VFLS"  u8 version  u16 count (2 to MAX_BUNDLE)  count x u32 frame length (little-endian)  frames...

:func:`split` checks the bundle's prefix and lengths against its size before any frame is decoded; each frame is then
decoded and checked on its own, exactly as if it had come alone.

A JSON document that travels as a tensor (a party's report: :func:`json_tensor`) is bounded before it is parsed
(:func:`json_from_tensor`): its size and its nesting depth, so that a report can neither take the receiver's
memory nor its stack.
"""

from __future__ import annotations

import json
import math
import numbers
import re
import struct
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import msgpack
import numpy as np
import torch
from torch import Tensor

from vflbench.net.errors import NetError, ProtocolError
from vflbench.protocol.messages import NO_IDS, Message, Scalar

MAGIC = b"VFLB"
#: Version 2: frames may travel in bundles (:func:`encode_bundle`).
VERSION = 2
_PREFIX = struct.Struct("<4sBI")
BUNDLE_MAGIC = b"VFLS"
_BUNDLE_PREFIX = struct.Struct("<4sBH")
_LENGTH = struct.Struct("<I")
#: Most frames one bundle carries.
MAX_BUNDLE = 16
#: Largest frame accepted by default (bytes, header and buffers together).
DEFAULT_MAX_FRAME_BYTES = 256 * 2**20
MAX_HEADER_BYTES = 64 * 2**10
MAX_TENSORS = 64
MAX_NDIM = 8
MAX_META = 64
MAX_STR = 4096
#: Most elements a tensor's shape may span, counting empty dimensions as 1 (so that its strides fit in 64 bits).
MAX_ELEMENTS = 2**40
#: Largest JSON document (a report) a party parses, in bytes, and its deepest nesting.
MAX_JSON_BYTES = 16 * 2**20
MAX_JSON_DEPTH = 32
FRAME_TYPES = ("message", "hello", "ready", "abort", "bye")
PHASES = ("train", "eval", "setup")
ROLES = ("send", "request", "reply")
#: The dtypes a tensor may have on the wire (name -> torch dtype); anything else is refused.
DTYPES: dict[str, torch.dtype] = {
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float32": torch.float32,
    "float64": torch.float64,
    "int8": torch.int8,
    "int16": torch.int16,
    "int32": torch.int32,
    "int64": torch.int64,
    "uint8": torch.uint8,
    "bool": torch.bool,
}
_DTYPE_NAMES = {v: k for k, v in DTYPES.items()}
_KIND = re.compile(r"[A-Za-z0-9_]+(\.[A-Za-z0-9_]+)*\Z")
_KIND_OR_EMPTY = re.compile(r"([A-Za-z0-9_]+(\.[A-Za-z0-9_]+)*)?\Z")
_NAME = re.compile(r"[A-Za-z0-9_-]+\Z")
_RUN = re.compile(r"[A-Za-z0-9_.:-]*\Z")
_HEADER_KEYS = frozenset(
    {"type", "kind", "receiver", "run", "epoch", "step", "phase", "role", "call", "meta", "ids", "tensors"}
)
_SPEC_KEYS = frozenset({"dtype", "shape", "nbytes"})
_INT64 = (-(2**63), 2**63 - 1)
_POSITION = (-1, 2**53)


@dataclass(frozen=True)
class Frame:
    """One unit on the wire: a message's fields (less its sender) or a control frame.

    ``call``: a request's number among its sender's requests (0 for other frames); its reply
    carries the same number back.
    """

    type: str
    kind: str = ""
    receiver: str = ""
    run: str = ""
    epoch: int = -1
    step: int = -1
    phase: str = "setup"
    role: str = "send"
    call: int = 0
    meta: Mapping[str, Scalar] = field(default_factory=dict)
    ids: Tensor = NO_IDS
    tensors: tuple[Tensor, ...] = ()

    @classmethod
    def of(cls, message: Message, *, run: str, call: int = 0) -> Frame:
        """The frame that carries ``message`` (its sender is not written: the link says who sent it)."""
        return cls(
            "message",
            message.kind,
            message.receiver,
            run,
            message.epoch,
            message.step,
            message.phase,
            message.role,
            call,
            dict(message.meta),
            message.ids,
            message.tensors,
        )

    def message(self, sender: str) -> Message:
        """The message this frame carries, from ``sender`` (the authenticated peer)."""
        if self.type != "message" or not self.tensors:
            raise ProtocolError(f"a {self.type!r} frame carries no message")
        first, *rest = self.tensors
        return Message(
            self.kind,
            sender,
            self.receiver,
            first,
            self.ids,
            self.epoch,
            self.step,
            self.phase,  # type: ignore[arg-type]
            tuple(rest),
            dict(self.meta),
            self.role,  # type: ignore[arg-type]
        )


def _check_byte_order() -> None:
    if sys.byteorder != "little":
        raise NetError(
            "vflbench frames carry little-endian buffers; this machine is big-endian, which is not supported"
        )


def _tensor_bytes(t: Tensor) -> tuple[dict[str, Any], memoryview]:
    t = t.detach().to("cpu").contiguous()
    name = _DTYPE_NAMES.get(t.dtype)
    if name is None:
        raise NetError(f"a tensor of dtype {t.dtype} cannot be sent; the wire carries {', '.join(DTYPES)}")
    raw = t.reshape(-1).view(torch.uint8).numpy()
    return {"dtype": name, "shape": list(t.shape), "nbytes": int(raw.nbytes)}, raw.data


def _plain(value: Any) -> Any:
    """A numpy integer or float (or a subclass of int or float) as the plain Python number the header allows."""
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    return value


def encode(frame: Frame) -> bytes:
    """The bytes of ``frame``."""
    _check_byte_order()
    ids_spec, ids_buf = _tensor_bytes(frame.ids)
    specs, bufs = [], []
    for t in frame.tensors:
        spec, buf = _tensor_bytes(t)
        specs.append(spec)
        bufs.append(buf)
    fields = {
        "type": frame.type,
        "kind": frame.kind,
        "receiver": frame.receiver,
        "run": frame.run,
        "epoch": _plain(frame.epoch),
        "step": _plain(frame.step),
        "phase": frame.phase,
        "role": frame.role,
        "call": _plain(frame.call),
        "meta": {k: _plain(v) for k, v in frame.meta.items()},
        "ids": ids_spec,
        "tensors": specs,
    }
    try:  # the receiver would refuse it: fail here, naming the field, before anything is sent
        _check_header(fields)
    except ProtocolError as exc:
        raise ProtocolError(f"cannot send this frame: {exc}") from None
    header = msgpack.packb(fields, use_bin_type=True)
    if len(header) > MAX_HEADER_BYTES:
        raise ProtocolError(
            f"cannot send this frame: its header takes {len(header)} bytes, over the limit of {MAX_HEADER_BYTES}"
        )
    return b"".join([_PREFIX.pack(MAGIC, VERSION, len(header)), header, ids_buf, *bufs])


def _refuse_ext(code: int, data: bytes) -> Any:
    raise ProtocolError(f"frame header holds a msgpack extension type ({code}); headers are plain msgpack")


def _int(header: Mapping[str, Any], key: str, bounds: tuple[int, int]) -> int:
    value = header[key]
    if type(value) is not int or not bounds[0] <= value <= bounds[1]:
        raise ProtocolError(
            f"frame header field {key!r} must be an integer in [{bounds[0]}, {bounds[1]}], got {_show(value)}"
        )
    return value


def _str(header: Mapping[str, Any], key: str, pattern: re.Pattern[str], *, limit: int = 128) -> str:
    value = header[key]
    if type(value) is not str or len(value) > limit or not pattern.match(value):
        raise ProtocolError(
            f"frame header field {key!r} must be a string matching {pattern.pattern!r} of at most "
            f"{limit} characters, got {_show(value)}"
        )
    return value


def _choice(header: Mapping[str, Any], key: str, valid: tuple[str, ...]) -> str:
    value = header[key]
    if type(value) is not str or value not in valid:
        raise ProtocolError(f"frame header field {key!r} must be one of {', '.join(valid)}, got {_show(value)}")
    return value


def _show(value: Any) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text[:60]}{'...' if len(text) > 60 else ''}"


def _meta(value: Any) -> dict[str, Scalar]:
    if type(value) is not dict or len(value) > MAX_META:
        raise ProtocolError(
            f"frame header field 'meta' must be a map of at most {MAX_META} entries, got {_show(value)}"
        )
    out: dict[str, Scalar] = {}
    for key, item in value.items():
        if type(key) is not str or not key or len(key) > 64:
            raise ProtocolError(f"a 'meta' key must be a string of 1 to 64 characters, got {_show(key)}")
        ok = (
            item is None
            or type(item) in (bool, float)
            or (type(item) is int and _INT64[0] <= item <= _INT64[1])
            or (type(item) is str and len(item) <= MAX_STR)
        )
        if not ok:
            raise ProtocolError(
                f"'meta' value {key!r} must be None, a bool, a 64-bit integer, a float or a string "
                f"of at most {MAX_STR} characters, got {_show(item)}"
            )
        out[key] = item
    return out


def _spec(value: Any, what: str) -> tuple[torch.dtype, tuple[int, ...], int]:
    if type(value) is not dict or set(value) != _SPEC_KEYS:
        raise ProtocolError(
            f"{what}: a tensor description must be a map with exactly the keys dtype, shape, nbytes, got {_show(value)}"
        )
    dtype = DTYPES.get(value["dtype"]) if type(value["dtype"]) is str else None
    if dtype is None:
        raise ProtocolError(f"{what}: dtype {_show(value['dtype'])} is not allowed; allowed: {', '.join(DTYPES)}")
    shape = value["shape"]
    if (
        type(shape) is not list
        or len(shape) > MAX_NDIM
        or any(type(s) is not int or not 0 <= s <= 2**40 for s in shape)
    ):
        raise ProtocolError(
            f"{what}: shape must be a list of at most {MAX_NDIM} non-negative integers, got {_show(shape)}"
        )
    if math.prod(max(s, 1) for s in shape) > MAX_ELEMENTS:
        raise ProtocolError(
            f"{what}: shape {tuple(shape)} spans more than 2^40 elements (empty dimensions counted "
            "as 1), which no message of the protocol has"
        )
    nbytes = value["nbytes"]
    expected = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
    if type(nbytes) is not int or nbytes != expected:
        raise ProtocolError(
            f"{what}: {value['dtype']} of shape {tuple(shape)} takes {expected} bytes, but nbytes says {_show(nbytes)}"
        )
    return dtype, tuple(shape), nbytes


_Spec = tuple[torch.dtype, tuple[int, ...], int]


def _check_header(header: Any) -> tuple[Frame, list[_Spec]]:
    """The header's fields (as a frame without tensors) and its tensor descriptions (ids first), after every check
    of the schema; :class:`ProtocolError` otherwise."""
    if type(header) is not dict or set(header) != _HEADER_KEYS:
        keys = sorted(map(str, header)) if type(header) is dict else _show(header)
        raise ProtocolError(
            f"frame header must be a map with exactly the keys {', '.join(sorted(_HEADER_KEYS))}; got {keys}"
        )
    ftype = _choice(header, "type", FRAME_TYPES)
    kind = _str(header, "kind", _KIND if ftype == "message" else _KIND_OR_EMPTY)
    receiver = _str(header, "receiver", _NAME, limit=64)
    run = _str(header, "run", _RUN)
    epoch, step = _int(header, "epoch", _POSITION), _int(header, "step", _POSITION)
    phase, role = _choice(header, "phase", PHASES), _choice(header, "role", ROLES)
    call = _int(header, "call", (0, 2**62))
    meta = _meta(header["meta"])
    specs = header["tensors"]
    if type(specs) is not list or len(specs) > MAX_TENSORS or (ftype == "message" and not specs):
        raise ProtocolError(
            f"frame header field 'tensors' must list 1 to {MAX_TENSORS} tensor descriptions for a "
            f"message (0 or more for control frames), got {_show(specs)}"
        )
    ids_spec = _spec(header["ids"], "ids")
    if ids_spec[0] != torch.int64 or len(ids_spec[1]) != 1:
        raise ProtocolError(f"ids must be a 1-d int64 tensor, got {ids_spec[0]} of shape {ids_spec[1]}")
    parsed = [ids_spec, *(_spec(s, f"tensor {i}") for i, s in enumerate(specs))]
    frame = Frame(ftype, kind, receiver, run, epoch, step, phase, role, call, meta)
    return frame, parsed


def _bounded(data: bytes | bytearray | memoryview, what: str, prefix: int, max_bytes: int) -> memoryview:
    """``data`` as bytes, checked to hold at least its ``prefix`` and at most ``max_bytes`` (:class:`ProtocolError`
    naming ``what`` otherwise)."""
    view = memoryview(data).cast("B")
    if len(view) > max_bytes:
        raise ProtocolError(f"{what} of {len(view)} bytes exceeds the limit of {max_bytes} bytes")
    if len(view) < prefix:
        raise ProtocolError(f"{what} of {len(view)} bytes is shorter than its {prefix}-byte prefix")
    return view


def decode(data: bytes | bytearray | memoryview, *, max_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> Frame:
    """The frame in ``data``, after every check (see the module docstring); :class:`ProtocolError` otherwise."""
    _check_byte_order()
    view = _bounded(data, "frame", _PREFIX.size, max_bytes)
    magic, version, header_len = _PREFIX.unpack_from(view)
    if magic != MAGIC:
        raise ProtocolError(f"frame does not start with {MAGIC!r} (got {bytes(magic)!r}): not a vflbench frame")
    if version != VERSION:
        raise ProtocolError(f"frame version {version} is not supported (this side speaks version {VERSION})")
    if header_len > MAX_HEADER_BYTES or _PREFIX.size + header_len > len(view):
        raise ProtocolError(
            f"frame header length {header_len} is over the limit of {MAX_HEADER_BYTES} bytes "
            f"or past the frame's end ({len(view)} bytes)"
        )
    try:
        header = msgpack.unpackb(
            view[_PREFIX.size : _PREFIX.size + header_len],
            raw=False,
            strict_map_key=True,
            use_list=True,
            ext_hook=_refuse_ext,
            max_str_len=MAX_STR,
            max_bin_len=0,
            max_ext_len=0,
            max_array_len=max(MAX_TENSORS, MAX_NDIM),
            max_map_len=MAX_META,
        )
    except ProtocolError:
        raise
    except Exception as exc:  # msgpack raises several types for malformed input; all mean the same here
        why = str(exc) or ("nested too deeply" if type(exc).__name__ == "StackError" else "no detail")
        raise ProtocolError(f"frame header is not valid msgpack: {type(exc).__name__}: {why}") from None
    base, parsed = _check_header(header)
    offset = _PREFIX.size + header_len
    if offset + sum(p[2] for p in parsed) != len(view):
        raise ProtocolError(
            f"frame of {len(view)} bytes does not match its header ({header_len} header bytes and "
            f"{sum(p[2] for p in parsed)} tensor bytes after the {_PREFIX.size}-byte prefix)"
        )
    tensors = []
    for i, (dtype, shape, nbytes) in enumerate(parsed):
        what = "ids" if i == 0 else f"tensor {i - 1}"
        try:
            if nbytes == 0:
                t = torch.empty(shape, dtype=dtype)
            else:
                t = torch.frombuffer(bytearray(view[offset : offset + nbytes]), dtype=dtype).reshape(shape)
        except (RuntimeError, ValueError) as exc:  # after the checks above this is not expected; refuse, never crash
            raise ProtocolError(f"{what}: {dtype} of shape {shape} cannot be built: {exc}") from None
        if nbytes and dtype == torch.bool and int(t.view(torch.uint8).max()) > 1:
            raise ProtocolError(f"{what}: a bool tensor holds bytes other than 0 and 1")
        tensors.append(t)
        offset += nbytes
    return replace(base, ids=tensors[0], tensors=tuple(tensors[1:]))


def encode_bundle(frames: list[bytes]) -> bytes:
    """One unit on the wire carrying the encoded ``frames`` in order (a single frame travels as it is)."""
    if len(frames) == 1:
        return frames[0]
    if not 2 <= len(frames) <= MAX_BUNDLE:
        raise NetError(f"a bundle carries 2 to {MAX_BUNDLE} frames, not {len(frames)}")
    lengths = b"".join(_LENGTH.pack(len(f)) for f in frames)
    return b"".join([_BUNDLE_PREFIX.pack(BUNDLE_MAGIC, VERSION, len(frames)), lengths, *frames])


def split(data: bytes | bytearray | memoryview, *, max_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> list[memoryview]:
    """The frames one unit on the wire carries, undecoded: ``data`` itself, or the frames of a bundle after the
    checks of its prefix and lengths (:class:`ProtocolError` otherwise). Each is then checked by :func:`decode`."""
    view = memoryview(data).cast("B")
    if bytes(view[:4]) != BUNDLE_MAGIC:
        return [view]
    view = _bounded(view, "bundle", _BUNDLE_PREFIX.size, max_bytes)
    _, version, count = _BUNDLE_PREFIX.unpack_from(view)
    if version != VERSION:
        raise ProtocolError(f"bundle version {version} is not supported (this side speaks version {VERSION})")
    start = _BUNDLE_PREFIX.size + count * _LENGTH.size
    if not 2 <= count <= MAX_BUNDLE or start > len(view):
        raise ProtocolError(f"a bundle must carry 2 to {MAX_BUNDLE} frames within its {len(view)} bytes, says {count}")
    lengths = [_LENGTH.unpack_from(view, _BUNDLE_PREFIX.size + i * _LENGTH.size)[0] for i in range(count)]
    if start + sum(lengths) != len(view):
        raise ProtocolError(
            f"bundle of {len(view)} bytes does not match its {count} frame lengths ({sum(lengths)} bytes after "
            f"the {start}-byte prefix)"
        )
    frames = []
    for n in lengths:
        frames.append(view[start : start + n])
        start += n
    return frames


def json_tensor(value: Any) -> Tensor:
    """``value`` as JSON in a 1-d uint8 tensor (a report of any size; a frame's ``meta`` strings are capped)."""
    return torch.frombuffer(bytearray(json.dumps(value).encode()), dtype=torch.uint8)


_JSON_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"')


def json_depth(data: bytes) -> int:
    """The deepest nesting of arrays and objects in the JSON text ``data`` (brackets inside strings not counted)."""
    bare = np.frombuffer(_JSON_STRING.sub(b'""', data), dtype=np.uint8)
    if not len(bare):
        return 0
    opens = (bare == ord("[")) | (bare == ord("{"))
    closes = (bare == ord("]")) | (bare == ord("}"))
    return int(np.cumsum(opens.astype(np.int64) - closes.astype(np.int64)).max(initial=0))


def json_from_tensor(tensor: Tensor, *, max_bytes: int = MAX_JSON_BYTES, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """The JSON value :func:`json_tensor` wrote, after checking its dtype, its size (``max_bytes``) and its nesting
    (``max_depth``) before parsing it; :class:`ProtocolError` naming what was wrong otherwise. Parsed as JSON only:
    nothing received is unpickled."""
    if tensor.dtype != torch.uint8 or tensor.dim() != 1:
        raise ProtocolError(f"a report must be a 1-d uint8 tensor of JSON, got {tensor.dtype} {tuple(tensor.shape)}")
    if tensor.numel() > max_bytes:
        raise ProtocolError(f"a report of {tensor.numel()} bytes exceeds the limit of {max_bytes} bytes")
    data = tensor.contiguous().numpy().tobytes()
    depth = json_depth(data)
    if depth > max_depth:
        raise ProtocolError(f"a report nested {depth} levels deep exceeds the limit of {max_depth} levels")
    try:
        return json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise ProtocolError(f"a report is not valid JSON: {exc}") from None
