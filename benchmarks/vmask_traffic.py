"""VMask's traffic per training step and masked layer: bytes, messages and rounds by message kind, measured by the
channel's counter (no timing, so the numbers do not depend on the machine).

For each bottom model (MLP3 on a TabMNIST half, 392 pixels; LeNet5 on an MNIST half, 1 x 28 x 14) and each of its
Linear/Conv2d layers, the layer alone is masked (P_k, the active party and the dealer joined by a channel) and two
training steps are run at batch 128 (``--batch``): the forward product and, for every layer but the first (whose
input, the data, needs no gradient), the input gradient's product. The second step's traffic is reported (the steady
state: ``fixed_mask`` deals a step's triples ahead, during the step before or the forward). The channel's
training-phase counters give per kind and direction the messages, bytes and rounds (a request and its reply are one
round trip); ``online`` is what the step's critical path carries (with ``fixed_mask`` everything but the dealer's
triples, which are asked for ahead and travel while the step goes on; with ``beaver`` everything). ``--protocol`` picks
the masked layers' protocol for the layers that take one (``fixed_mask``: the default with ``truncation: reveal``;
``beaver``: a fresh Beaver triple per product opening both operands, the protocol before issue 26); ``all`` measures
every protocol this version has. Writes a JSON (``--out``) and prints a Markdown table.

    PYTHONPATH=src python benchmarks/vmask_traffic.py --out vmask_traffic.json
"""

from __future__ import annotations

import argparse
import copy
import inspect
import json
from pathlib import Path

import torch
from torch import nn

from vflbench.models.zoo import lenet5, mlp3
from vflbench.mpc.dealer import Dealer
from vflbench.mpc.layers import mask_layer, mask_submodule
from vflbench.mpc.parties import local_session

MODELS = {
    "mlp3_tabmnist": (lambda: mlp3(input_shape=(392,), out_dim=16), (392,)),
    "lenet5_mnist": (lambda: lenet5(input_shape=(1, 28, 14), out_dim=16), (1, 28, 14)),
}


def protocols() -> list[str]:
    """The protocols ``mask_layer`` of this version offers (before issue 26: one, the per-product Beaver)."""
    parameter = inspect.signature(mask_layer).parameters.get("protocol")
    return ["beaver"] if parameter is None else ["fixed_mask", "beaver"]


def one_step(model_name: str, layer_name: str, protocol: str, batch: int, first: bool) -> dict:
    """The training-phase traffic of one step of the model with ``layer_name`` masked alone."""
    build, shape = MODELS[model_name]
    torch.manual_seed(0)
    model = build()
    session = local_session(Dealer(1), noise=torch.Generator().manual_seed(2))
    kwargs = {
        "link": session.passive,
        "generator_passive": torch.Generator().manual_seed(3),
        "sigma": 0.01,
        "phase": "setup",
    }
    if "protocol" in inspect.signature(mask_layer).parameters:
        kwargs["protocol"] = protocol
    mask_submodule(model, layer_name, **kwargs)
    x = torch.rand(batch, *shape, generator=torch.Generator().manual_seed(4))
    before: dict = {}
    for _ in range(2):
        before = copy.deepcopy(session.channel.stats["train"].as_dict()["by_kind"])
        out = model(x)
        out.backward(torch.randn(out.shape, generator=torch.Generator().manual_seed(5)))
    after = session.channel.stats["train"].as_dict()["by_kind"]
    by_kind = {
        kind: {
            d: {k: v - before.get(kind, {}).get(d, {}).get(k, 0) for k, v in s.items()} for d, s in directions.items()
        }
        for kind, directions in after.items()
    }
    by_kind = {k: v for k, v in by_kind.items() if any(s["messages"] for s in v.values())}

    def total(key: str, keep=lambda kind: True) -> int:
        return sum(s.get(key, 0) for kind, v in by_kind.items() if keep(kind) for s in v.values())

    rounds = total("rounds")
    if not any("rounds" in s for v in by_kind.values() for s in v.values()):  # no rounds counted (before issue 26)
        rounds = total("messages") // 2
    ahead = protocol == "fixed_mask" and _deals_ahead()

    def online(kind: str) -> bool:
        return not (ahead and kind.startswith("dealer."))

    return {
        "model": model_name,
        "layer": layer_name,
        "protocol": protocol,
        "first": first,
        "bytes": total("bytes"),
        "messages": total("messages"),
        "rounds": rounds,
        "online_bytes": total("bytes", online),
        "online_rounds": total("rounds", online) if rounds else 0,
        "by_kind": by_kind,
    }


def _deals_ahead() -> bool:
    """Whether this version's fixed_mask deals a step's triples ahead (``SharedLayer.settle`` exists)."""
    from vflbench.mpc import layers

    return hasattr(layers.SharedLayer, "settle")


def measure(batch: int, wanted: list[str]) -> list[dict]:
    """Every (model, layer, protocol) row."""
    rows = []
    for model_name, (build, _) in MODELS.items():
        names = [n for n, m in build().named_modules() if isinstance(m, (nn.Linear, nn.Conv2d))]
        for i, name in enumerate(names):
            for protocol in wanted:
                rows.append(one_step(model_name, name, protocol, batch, first=i == 0))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--protocol", default="all", help="fixed_mask, beaver or all (default)")
    parser.add_argument("--out", type=Path, default=Path("vmask_traffic.json"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    available = protocols()
    wanted = available if args.protocol == "all" else [args.protocol]
    unknown = [p for p in wanted if p not in available]
    if unknown:
        parser.error(f"unknown protocol {unknown[0]!r}; this version has: {', '.join(available)}, all")
    rows = measure(args.batch, wanted)
    args.out.write_text(json.dumps({"batch": args.batch, "rows": copy.deepcopy(rows)}, indent=1) + "\n")
    print("| model | layer | protocol | kB/step | online kB | messages/step | rounds/step | online rounds |")
    print("|---|---|---|---:|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['model']} | {r['layer']}{' (forward only)' if r['first'] else ''} | {r['protocol']} "
            f"| {r['bytes'] / 1e3:,.1f} | {r['online_bytes'] / 1e3:,.1f} | {r['messages']} | {r['rounds']} "
            f"| {r['online_rounds']} |"
        )


if __name__ == "__main__":
    main()
