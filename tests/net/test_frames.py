"""Frames: every message survives the wire unchanged; anything malformed or hostile is refused unread."""

from __future__ import annotations

import pickle
import struct
import subprocess
import sys
import textwrap

import msgpack
import pytest
import torch

pytest.importorskip("msgpack")
from conftest import child_env

from vflbench.net.errors import ProtocolError
from vflbench.net.frames import (
    BUNDLE_MAGIC,
    DTYPES,
    MAGIC,
    MAX_BUNDLE,
    VERSION,
    Frame,
    decode,
    encode,
    encode_bundle,
    split,
)
from vflbench.protocol.messages import Message


def tensors() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    out = [torch.randn(3, 4, generator=g).to(getattr(torch, name)) for name in DTYPES if name != "bool"]
    out += [
        torch.rand(2, 3, generator=g) > 0.5,  # bool
        torch.tensor(7.5),  # 0-d
        torch.zeros(0, 5, dtype=torch.int64),  # empty
        torch.randn(4, 3, generator=g).T,  # not contiguous
        torch.randint(-(2**62), 2**62, (2, 2, 2, 2), generator=g),
    ]  # int64 ring elements, 4-d
    return out


def test_a_message_round_trips_with_every_dtype_shape_and_meta_type():
    ts = tensors()
    meta = {"layer": 3, "scale": 0.125, "name": "fc1", "last": True, "none": None, "big": -(2**63)}
    m = Message(
        "vmask.open", "passive_1", "active", ts[0], torch.arange(5), 2, 17, "eval", tuple(ts[1:]), meta, "request"
    )
    f = decode(encode(Frame.of(m, run="run-1", call=42)))
    assert (f.type, f.run, f.call) == ("message", "run-1", 42)
    back = f.message("passive_1")
    assert (back.kind, back.sender, back.receiver, back.epoch, back.step, back.phase, back.role) == (
        "vmask.open",
        "passive_1",
        "active",
        2,
        17,
        "eval",
        "request",
    )
    assert back.meta == meta and all(type(back.meta[k]) is type(v) for k, v in meta.items())
    assert torch.equal(back.ids, torch.arange(5))
    assert len(back.tensors) == len(ts)
    for sent, got in zip(ts, back.tensors, strict=True):
        assert got.dtype == sent.dtype and got.shape == sent.shape and torch.equal(got, sent)
    # received tensors own writable memory (no shared or read-only buffer from the frame)
    back.payload.add_(1)


def test_the_sender_is_never_read_from_the_frame():
    m = Message("embedding", "passive_1", "active", torch.ones(2))
    assert b"passive_1" not in encode(Frame.of(m, run="r"))
    assert decode(encode(Frame.of(m, run="r"))).message("passive_2").sender == "passive_2"


def frame_bytes(header: dict, *buffers: bytes, version: int = VERSION, magic: bytes = MAGIC) -> bytes:
    raw = msgpack.packb(header, use_bin_type=True)
    return struct.pack("<4sBI", magic, version, len(raw)) + raw + b"".join(buffers)


def good_header(**changes) -> dict:
    header = {
        "type": "message",
        "kind": "embedding",
        "receiver": "active",
        "run": "r",
        "epoch": 0,
        "step": 0,
        "phase": "train",
        "role": "send",
        "call": 0,
        "meta": {},
        "ids": {"dtype": "int64", "shape": [0], "nbytes": 0},
        "tensors": [{"dtype": "float32", "shape": [2], "nbytes": 8}],
    }
    header.update(changes)
    return header


class Evil:
    def __reduce__(self):
        return (print, ("unpickled!",))


EVIL = pickle.dumps(Evil())


def test_the_hand_built_good_frame_is_accepted():
    assert torch.equal(
        decode(frame_bytes(good_header(), struct.pack("<2f", 1, 2))).tensors[0], torch.tensor([1.0, 2.0])
    )


MALFORMED = {
    "a pickle instead of a frame": (EVIL, "does not start"),
    "empty": (b"", "shorter"),
    "wrong magic": (frame_bytes(good_header(), bytes(8), magic=b"PKL\x80"), "does not start"),
    "wrong version": (frame_bytes(good_header(), bytes(8), version=9), "version 9"),
    "truncated buffer": (frame_bytes(good_header(), bytes(7)), "does not match its header"),
    "trailing bytes": (frame_bytes(good_header(), bytes(9)), "does not match its header"),
    "header length past the end": (struct.pack("<4sBI", MAGIC, VERSION, 10_000) + b"\x80", "past the frame's end"),
    "header not msgpack": (struct.pack("<4sBI", MAGIC, VERSION, 3) + b"\xc1\xc1\xc1", "not valid msgpack"),
    "header is a list": (struct.pack("<4sBI", MAGIC, VERSION, 1) + b"\x90", "exactly the keys"),
    "missing key": (frame_bytes({k: v for k, v in good_header().items() if k != "step"}, bytes(8)), "exactly the keys"),
    "extra key (a sender claim)": (frame_bytes(good_header(sender="active"), bytes(8)), "exactly the keys"),
    "pickle in a binary header value": (frame_bytes(good_header(kind=EVIL), bytes(8)), "not valid msgpack"),
    "msgpack extension type": (frame_bytes(good_header(meta={"x": msgpack.ExtType(1, EVIL)}), bytes(8)), "ext"),
    "object dtype": (
        frame_bytes(good_header(tensors=[{"dtype": "object", "shape": [2], "nbytes": 8}]), bytes(8)),
        "not allowed",
    ),
    "complex dtype": (
        frame_bytes(good_header(tensors=[{"dtype": "complex64", "shape": [1], "nbytes": 8}]), bytes(8)),
        "not allowed",
    ),
    "shape disagrees with nbytes": (
        frame_bytes(good_header(tensors=[{"dtype": "float32", "shape": [3], "nbytes": 8}]), bytes(8)),
        "takes 12 bytes",
    ),
    "negative dimension": (
        frame_bytes(good_header(tensors=[{"dtype": "float32", "shape": [-2], "nbytes": -8}]), bytes(8)),
        "non-negative",
    ),
    "too many dimensions": (
        frame_bytes(good_header(tensors=[{"dtype": "uint8", "shape": [1] * 9, "nbytes": 1}]), bytes(1)),
        "at most 8",
    ),
    "huge shape": (
        frame_bytes(good_header(tensors=[{"dtype": "float64", "shape": [2**40, 2**40], "nbytes": 2**63}]), bytes(8)),
        "spans more than",
    ),
    # empty, but its strides would overflow: refused before torch is asked to build it (was a RuntimeError)
    "empty tensor with huge dimensions": (
        frame_bytes(good_header(tensors=[{"dtype": "float32", "shape": [0, 2**40, 2**40], "nbytes": 0}])),
        "spans more than",
    ),
    "header nested too deeply": (struct.pack("<4sBI", MAGIC, VERSION, 60_000) + b"\x91" * 60_000, "nested too deeply"),
    "no tensors in a message": (frame_bytes(good_header(tensors=[])), "'tensors'"),
    "ids not int64": (
        frame_bytes(good_header(ids={"dtype": "float32", "shape": [2], "nbytes": 8}), bytes(16)),
        "1-d int64",
    ),
    "bool bytes other than 0 and 1": (
        frame_bytes(good_header(tensors=[{"dtype": "bool", "shape": [2], "nbytes": 2}]), b"\x01\x07"),
        "other than 0 and 1",
    ),
    "meta value a list": (frame_bytes(good_header(meta={"x": [1, 2]}), bytes(8)), "'meta' value"),
    "meta value a map": (frame_bytes(good_header(meta={"x": {"y": 1}}), bytes(8)), "'meta' value"),
    "meta key not a string": (frame_bytes(good_header(meta={1: 2}), bytes(8)), "not valid msgpack"),
    "epoch a float": (frame_bytes(good_header(epoch=1.0), bytes(8)), "'epoch'"),
    "step a bool": (frame_bytes(good_header(step=True), bytes(8)), "'step'"),
    "negative call": (frame_bytes(good_header(call=-1), bytes(8)), "'call'"),
    "unknown frame type": (frame_bytes(good_header(type="exec"), bytes(8)), "'type'"),
    "unknown role": (frame_bytes(good_header(role="admin"), bytes(8)), "'role'"),
    "unknown phase": (frame_bytes(good_header(phase="attack"), bytes(8)), "'phase'"),
    "kind with a path": (frame_bytes(good_header(kind="../../etc"), bytes(8)), "'kind'"),
    "receiver not a name": (frame_bytes(good_header(receiver="active; rm -rf"), bytes(8)), "'receiver'"),
}


@pytest.mark.parametrize("name", list(MALFORMED))
def test_malformed_frames_are_refused_with_a_reason(name):
    data, reason = MALFORMED[name]
    with pytest.raises(ProtocolError, match=reason.replace("(", r"\(").replace(")", r"\)")):
        decode(data)


def test_frames_over_the_size_limit_are_refused_before_parsing():
    data = encode(Frame.of(Message("embedding", "passive_1", "active", torch.zeros(1000)), run="r"))
    decode(data, max_bytes=len(data))
    with pytest.raises(ProtocolError, match="exceeds the limit"):
        decode(data, max_bytes=len(data) - 1)


def test_a_bundle_carries_its_frames_in_order_and_a_single_frame_travels_as_it_is():
    first = encode(Frame.of(Message("embedding", "passive_1", "active", torch.ones(3), torch.arange(3)), run="r"))
    second = encode(
        Frame.of(Message("passive.forward", "passive_1", "active", torch.empty(0), role="reply"), run="r", call=4)
    )
    assert encode_bundle([first]) == first and [bytes(p) for p in split(first)] == [first]
    bundle = encode_bundle([first, second])
    assert bundle.startswith(BUNDLE_MAGIC) and len(bundle) == len(first) + len(second) + 7 + 8
    frames = [decode(p) for p in split(bundle)]
    assert [(f.kind, f.role, f.call) for f in frames] == [("embedding", "send", 0), ("passive.forward", "reply", 4)]
    assert torch.equal(frames[0].tensors[0], torch.ones(3))


def bundle_bytes(count: int, lengths: list[int], body: bytes, version: int = VERSION) -> bytes:
    return struct.pack("<4sBH", BUNDLE_MAGIC, version, count) + b"".join(struct.pack("<I", n) for n in lengths) + body


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (bundle_bytes(2, [3, 3], bytes(6), version=9), "bundle version 9"),
        (bundle_bytes(1, [6], bytes(6)), "2 to 16 frames"),
        (bundle_bytes(MAX_BUNDLE + 1, [0] * (MAX_BUNDLE + 1), b""), "2 to 16 frames"),
        (bundle_bytes(2, [3, 4], bytes(6)), "does not match its 2 frame lengths"),
        (bundle_bytes(2, [3, 3], bytes(8)), "does not match its 2 frame lengths"),
        (struct.pack("<4sBH", BUNDLE_MAGIC, VERSION, 2000), "2 to 16 frames"),
        (BUNDLE_MAGIC + b"\x02", "shorter than its"),
    ],
)
def test_malformed_bundles_are_refused_before_any_frame_is_decoded(data, reason):
    with pytest.raises(ProtocolError, match=reason):
        split(data)


def test_each_frame_of_a_bundle_is_checked_on_its_own():
    good = encode(Frame.of(Message("embedding", "passive_1", "active", torch.ones(3)), run="r"))
    bad = frame_bytes(good_header(type="exec"), bytes(8))
    pieces = split(encode_bundle([good, bad]))
    assert decode(pieces[0]).kind == "embedding"
    with pytest.raises(ProtocolError, match="'type'"):
        decode(pieces[1])


HOSTILE_SCRIPT = textwrap.dedent("""
    import pickle, struct, sys, threading
    found = []

    def hook(event, args):
        if event == "pickle.find_class":
            found.append(args)
            raise RuntimeError("pickle.find_class on the network path: " + repr(args))

    import msgpack, torch
    from vflbench.net.errors import ProtocolError, PeerFailed
    from vflbench.net.frames import MAGIC, VERSION, decode, Frame, encode
    from vflbench.net.transport import NetChannel, NetOptions, METHOD
    from vflbench.protocol.messages import Message
    import grpc

    class Evil:
        def __reduce__(self):
            return (print, ("unpickled!",))

    evil = pickle.dumps(Evil())
    def frame(header, *buffers):
        raw = msgpack.packb(header, use_bin_type=True)
        return struct.pack("<4sBI", MAGIC, VERSION, len(raw)) + raw + b"".join(buffers)

    def header(**kw):
        h = {"type": "message", "kind": "embedding", "receiver": "active", "run": "r", "epoch": 0, "step": 0,
             "phase": "train", "role": "send", "call": 0, "meta": {}, "ids": {"dtype": "int64", "shape": [0],
             "nbytes": 0}, "tensors": [{"dtype": "float32", "shape": [2], "nbytes": 8}]}
        h.update(kw)
        return h

    hostile = [evil, evil * 3, frame(header(kind=evil), bytes(8)), frame(header(meta={"x": evil}), bytes(8)),
               frame(header(meta={"x": msgpack.ExtType(5, evil)}), bytes(8)),
               frame(header(tensors=[{"dtype": "object", "shape": [len(evil)], "nbytes": len(evil)}]), evil),
               frame(header(tensors=[{"dtype": "float32", "shape": [2], "nbytes": 8}]), evil),
               MAGIC + bytes([VERSION]) + struct.pack("<I", len(evil)) + evil]
    sys.addaudithook(hook)
    refused = 0
    for data in hostile:
        try:
            decode(data)
        except ProtocolError:
            refused += 1
    # a pickle where a uint8 tensor's bytes belong is only bytes: it arrives as numbers, never as an object
    ok = decode(frame(header(tensors=[{"dtype": "uint8", "shape": [len(evil)], "nbytes": len(evil)}]), evil))
    assert bytes(ok.tensors[0].numpy()) == evil

    # the same through a live link: a hostile frame after a valid greeting ends the run with a ProtocolError
    net = []
    for data in hostile[:3]:
        active = NetChannel(name="active", run="r", parties=["active", "passive_1"],
                            addresses={"active": "127.0.0.1:0"}, insecure=True,
                            options=NetOptions(start_timeout=5, receive_timeout=5, close_timeout=1))
        address = active.listen()
        hello = encode(Frame("hello", receiver="active", run="r", meta={"party": "passive_1", "version": VERSION}))
        channel = grpc.insecure_channel(address)
        call = channel.stream_stream(METHOD)(iter([hello, data]), wait_for_ready=True)
        threading.Thread(target=lambda: list(call), daemon=True).start()
        try:
            active.start()
            active.receive("embedding", "passive_1", epoch=0, step=0)
        except ProtocolError as exc:
            net.append(str(exc))
        finally:
            active.close()
            channel.close()
    print("REFUSED", refused, len(hostile), "NET", len(net), "FOUND", len(found))
    print("\\n".join(net))
    # the control: the hook does fire when something unpickles (so an empty `found` above means something)
    try:
        pickle.loads(pickle.dumps(ProtocolError("x")))
    except RuntimeError:
        pass
    print("CONTROL", len(found))
""")


@pytest.mark.slow
def test_hostile_frames_never_reach_the_unpickler():
    """Decoding hostile frames (and feeding them through a live link) never calls pickle.find_class.

    Runs in a subprocess so that the audit hook (which cannot be removed) stays out of other tests."""
    proc = subprocess.run(
        [sys.executable, "-c", HOSTILE_SCRIPT], capture_output=True, text=True, timeout=60, env=child_env()
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert "REFUSED 8 8 NET 3 FOUND 0" in lines, proc.stdout + proc.stderr[-3000:]
    assert sum("refused a frame from passive_1" in line for line in lines) == 3, proc.stdout
    assert "CONTROL 1" in lines, proc.stdout


def test_the_sender_refuses_what_the_receiver_would_refuse_and_sends_numpy_scalars_as_numbers():
    import numpy as np

    ok = Message("embedding", "passive_1", "active", torch.ones(1), meta={"loss": np.float64(0.5), "n": np.int64(3)})
    meta = decode(encode(Frame.of(ok, run="r"))).meta
    assert meta == {"loss": 0.5, "n": 3} and type(meta["loss"]) is float and type(meta["n"]) is int
    with pytest.raises(ProtocolError, match="cannot send this frame: 'meta' value 'x'"):
        encode(Frame.of(Message("embedding", "passive_1", "active", torch.ones(1), meta={"x": [1]}), run="r"))
    with pytest.raises(ProtocolError, match="cannot send this frame: frame header field 'kind'"):
        encode(Frame.of(Message("bad kind!", "passive_1", "active", torch.ones(1)), run="r"))
