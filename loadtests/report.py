"""The printed reports: each bench's table and the ratios its issue targets, with a verdict per target."""

from __future__ import annotations

import statistics

from cpu import Usage
from result import Result


def print_report(results: list[Result]) -> None:
    """bench.py: gateway vs in-process onnxruntime and vs the naive baseline."""
    print()
    print(f"{'model':<11} {'mode':<16} {'conc':>4} {'rows/s':>9} {'p50 ms':>8} {'p99 ms':>8} {'CPU ms/req':>10}")
    for r in results:
        cpu = "" if r.cpu_ms is None else f"{r.cpu_ms:.3f}"
        print(
            f"{r.model:<11} {r.mode:<16} {r.concurrency:>4} {r.throughput:>9.0f} "
            f"{r.percentile(50):>8.2f} {r.percentile(99):>8.2f} {cpu:>10}"
        )

    def get(model: str, mode: str, concurrency: int) -> Result | None:
        for r in results:
            if (r.model, r.mode, r.concurrency) == (model, mode, concurrency):
                return r
        return None

    print("\nTargets (ratios from this run):")
    top = max(r.concurrency for r in results if r.mode == "http-binary")
    checks: list[tuple[str, Result | None, Result | None, float]] = [
        (
            "classifier: gateway HTTP binary vs in-process b32 throughput",
            get("classifier", "http-binary", top),
            get("classifier", "in-process b32", 32),
            0.95,
        ),
        (
            "classifier: gateway HTTP JSON vs naive baseline throughput",
            get("classifier", "http-json", top),
            get("classifier", "naive-json", top),
            1.25,
        ),
    ]
    for mode in ("http-binary", "grpc", "http-json"):
        checks.append(
            (
                f"mlp: gateway {mode} vs naive baseline throughput",
                get("mlp", mode, top),
                get("mlp", "naive-json", top),
                1.5,
            )
        )
    for label, gateway, baseline, target in checks:
        if gateway is None or baseline is None:
            continue
        value = gateway.throughput / baseline.throughput
        verdict = "ok" if value >= target else "MISSED"
        print(f"  {label}: {value:.2f}x (target >= {target}x) {verdict}")
    triton = get("mlp", "triton-json", top)
    gateway_json = get("mlp", "http-json", top)
    if triton is not None and gateway_json is not None:
        value = gateway_json.throughput / triton.throughput
        print(f"  mlp: gateway HTTP JSON vs Triton's HTTP front end throughput: {value:.2f}x (target >= 1.0x) "
              f"{'ok' if value >= 1.0 else 'MISSED'}")
    print_cpu_targets(get("mlp", "http-json", top), get("mlp", "floor-json", top),
                      get("mlp", "grpc", top), get("mlp", "floor-grpc", top))
    naive = get("mlp", "naive-json", top)
    for mode in ("http-binary", "grpc", "http-json"):
        gateway = get("mlp", mode, top)
        if gateway is not None and naive is not None:
            better = gateway.percentile(99) < naive.percentile(99)
            print(
                f"  mlp p99 at {top} clients, gateway {mode} {gateway.percentile(99):.2f} ms vs naive "
                f"{naive.percentile(99):.2f} ms: {'lower' if better else 'NOT lower'}"
            )
    inproc = get("mlp", "in-process b1", 1)
    for mode in ("http-binary", "grpc", "http-json"):
        gateway = get("mlp", mode, 1)
        if gateway is not None and inproc is not None:
            added = gateway.percentile(50) - inproc.percentile(50)
            verdict = "ok" if added <= 1.5 else "MISSED"
            print(f"  mlp 1 client, {mode}: p50 adds {added:.2f} ms over the in-process call (target <= 1.5) {verdict}")


def print_cpu_targets(
    json: Result | None, json_floor: Result | None, grpc: Result | None, grpc_floor: Result | None
) -> None:
    """The gateway's CPU per request against the floors of a Python server (bare ASGI / grpc.aio apps)."""
    if json is not None and json.cpu_ms is not None and json_floor is not None and json_floor.cpu_ms:
        ratio = json.cpu_ms / json_floor.cpu_ms
        verdict = "ok" if json.cpu_ms <= 0.10 and ratio <= 2.0 else "MISSED"
        print(f"  mlp HTTP JSON: gateway {json.cpu_ms:.3f} ms CPU/request, {ratio:.2f}x the HTTP floor's "
              f"{json_floor.cpu_ms:.3f} ms (target <= 0.10 ms and <= 2x) {verdict}")
    if grpc is not None and grpc.cpu_ms is not None and grpc_floor is not None and grpc_floor.cpu_ms:
        ratio = grpc.cpu_ms / grpc_floor.cpu_ms
        print(f"  mlp gRPC: gateway {grpc.cpu_ms:.3f} ms CPU/request, {ratio:.2f}x the grpc.aio floor's "
              f"{grpc_floor.cpu_ms:.3f} ms (target <= 1.3x) {'ok' if ratio <= 1.3 else 'MISSED'}")


def print_triton_report(results: list[Result], cpu: dict[tuple[str, str, int], Usage]) -> None:
    """bench_triton.py: the gateway vs direct Triton, and both vs a bare Python gRPC hop (the floor)."""

    def get(model: str, mode: str, concurrency: int) -> Result:
        return next(r for r in results if (r.model, r.mode, r.concurrency) == (model, mode, concurrency))

    print(f"\n{'model':<11} {'mode':<13} {'conc':>4} {'req/s':>8} {'p50 ms':>8} {'p99 ms':>8}   CPU ms/req: "
          f"{'hop':>5} {'triton':>6} {'client':>6}")
    for r in results:
        p50, p99 = r.percentile(50), r.percentile(99)
        hop, server, client = cpu[(r.model, r.mode, r.concurrency)]
        print(f"{r.model:<11} {r.mode:<13} {r.concurrency:>4} {r.throughput:>8.0f} {p50:>8.2f} {p99:>8.2f}"
              f"               {hop:>5.2f} {server:>6.2f} {client:>6.2f}")
    top, low = max(r.concurrency for r in results), min(r.concurrency for r in results)
    print("\nGateway vs direct Triton (targets: throughput >= 0.9x at 32 clients, p50 adds <= 1 ms at 1 client):")
    ratios = []
    models = list(dict.fromkeys(r.model for r in results))
    for model in models:
        for protocol in ("grpc", "http"):
            gateway, direct = get(model, f"gateway-{protocol}", top), get(model, f"triton-{protocol}", top)
            ratio = gateway.throughput / direct.throughput
            ratios.append(ratio)
            gateway_p50 = get(model, f"gateway-{protocol}", low).percentile(50)
            added = gateway_p50 - get(model, f"triton-{protocol}", low).percentile(50)
            print(f"  {model:<10} {protocol:<4}: throughput at {top} clients {ratio:.2f}x "
                  f"({'ok' if ratio >= 0.9 else 'MISSED'}); p50 at {low} client(s) +{added:.2f} ms "
                  f"({'ok' if added <= 1.0 else 'MISSED'})")
    print(f"  median throughput ratio {statistics.median(ratios):.2f}x")
    print("A bare Python gRPC hop (floor-grpc) vs direct Triton, and the gateway vs that floor:")
    for model in models:
        floor, direct, gateway = (get(model, mode, top) for mode in ("floor-grpc", "triton-grpc", "gateway-grpc"))
        floor_added = get(model, "floor-grpc", low).percentile(50) - get(model, "triton-grpc", low).percentile(50)
        gateway_added = get(model, "gateway-grpc", low).percentile(50) - get(model, "floor-grpc", low).percentile(50)
        print(f"  {model:<10} floor {floor.throughput / direct.throughput:.2f}x of direct at {top} clients, "
              f"+{floor_added:.2f} ms p50 at {low}; gateway {gateway.throughput / floor.throughput:.2f}x of the floor, "
              f"+{gateway_added:.2f} ms p50 over it")
    print("The gateway's own CPU per request on the Triton path (target for the tiny model over HTTP: <= 0.25 ms):")
    for model in models:
        for protocol in ("http", "grpc"):
            hop = cpu[(model, f"gateway-{protocol}", top)][0]
            verdict = f" ({'ok' if hop <= 0.25 else 'MISSED'})" if (model, protocol) == ("mlp", "http") else ""
            print(f"  {model:<10} {protocol:<4}: {hop:.2f} ms at {top} clients{verdict}")
