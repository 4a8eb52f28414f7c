"""The printed reports: each bench's table and the ratios its issue targets, with a verdict per target."""

from __future__ import annotations

import statistics

from cpu import Usage
from result import Result


def median_rounds(results: list[Result]) -> list[Result]:
    """One run per (model, mode, concurrency): the round of median throughput, in the order they were first run."""
    groups: dict[tuple[str, str, int], list[Result]] = {}
    for r in results:
        groups.setdefault((r.model, r.mode, r.concurrency), []).append(r)
    return [sorted(runs, key=lambda r: r.throughput)[len(runs) // 2] for runs in groups.values()]


def paired(results: list[Result], a: tuple[str, str, int], b: tuple[str, str, int]) -> list[tuple[Result, Result]]:
    """The runs of ``a`` and ``b`` (model, mode, concurrency) made in the same round, round by round."""
    rounds = {r.round: r for r in results if (r.model, r.mode, r.concurrency) == b and r.round >= 0}
    return [(r, rounds[r.round]) for r in results if (r.model, r.mode, r.concurrency) == a and r.round in rounds]


def _rounds(values: list[float]) -> str:
    """``1.23x`` for one round; the median and every round's value for several."""
    if len(values) == 1:
        return f"{values[0]:.2f}x"
    return f"{statistics.median(values):.2f}x (median of rounds {' / '.join(f'{v:.2f}' for v in values)})"


def print_report(results: list[Result]) -> None:
    """bench.py: gateway vs in-process onnxruntime, the naive baseline, the floors and Triton. The table keeps each
    mode's median round; each ratio pairs the runs of one round, and its target reads the median of those."""
    table = median_rounds(results)
    print()
    print(f"{'model':<11} {'mode':<17} {'conc':>4} {'rows/s':>9} {'p50 ms':>8} {'p99 ms':>8} {'CPU ms/req':>10}")
    for r in table:
        cpu = "" if r.cpu_ms is None else f"{r.cpu_ms:.3f}"
        print(
            f"{r.model:<11} {r.mode:<17} {r.concurrency:>4} {r.throughput:>9.0f} "
            f"{r.percentile(50):>8.2f} {r.percentile(99):>8.2f} {cpu:>10}"
        )

    def get(model: str, mode: str, concurrency: int) -> Result | None:
        return next((r for r in table if (r.model, r.mode, r.concurrency) == (model, mode, concurrency)), None)

    def throughputs(model: str, mode: str, baseline: str, concurrency: int) -> list[float]:
        pairs = paired(results, (model, mode, concurrency), (model, baseline, 32 if baseline == "in-process b32"
                                                              else concurrency))
        return [gateway.throughput / base.throughput for gateway, base in pairs]

    print("\nTargets (ratios from this run):")
    top = max(r.concurrency for r in results if r.mode == "http-binary")
    checks = [
        ("classifier: gateway HTTP binary vs in-process b32 throughput",
         throughputs("classifier", "http-binary", "in-process b32", top), 0.95),
        ("classifier: gateway HTTP JSON vs naive baseline throughput",
         throughputs("classifier", "http-json", "naive-json", top), 1.25),
        *((f"mlp: gateway {mode} vs naive baseline throughput", throughputs("mlp", mode, "naive-json", top), 1.5)
          for mode in ("http-binary", "grpc", "http-json")),
        ("mlp: gateway HTTP JSON vs Triton's HTTP front end throughput",
         throughputs("mlp", "http-json", "triton-json", top), 1.0),
    ]  # fmt: skip
    for label, values, target in checks:
        if values:
            verdict = "ok" if statistics.median(values) >= target else "MISSED"
            print(f"  {label}: {_rounds(values)} (target >= {target}x) {verdict}")
    print_cpu_targets(paired(results, ("mlp", "http-json", top), ("mlp", "floor-json", top)),
                      paired(results, ("mlp", "grpc", top), ("mlp", "floor-grpc", top)),
                      paired(results, ("mlp", "grpc-stream", top), ("mlp", "floor-grpc-stream", top)))  # fmt: skip
    print_stream_vs_unary("mlp", top, paired(results, ("mlp", "grpc-stream", top), ("mlp", "grpc", top)))
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
    json: list[tuple[Result, Result]], grpc: list[tuple[Result, Result]], stream: list[tuple[Result, Result]]
) -> None:
    """The gateway's CPU per request against the floors of a Python server (bare ASGI / grpc.aio apps, and a bare
    grpc.aio stream), as (gateway, floor) runs of the same round."""
    _cpu_target("mlp HTTP JSON", "HTTP floor", json, 2.0, 0.10)
    _cpu_target("mlp gRPC", "grpc.aio floor", grpc, 1.3, None)
    _cpu_target("mlp gRPC stream", "stream floor", stream, 1.3, None)


def print_stream_vs_unary(model: str, concurrency: int, pairs: list[tuple[Result, Result]]) -> None:
    """What a stream saves over unary calls on the gateway, from (stream, unary) runs of the same round: no target,
    the figure the stream's users weigh it by."""
    if not pairs:
        return
    throughput = [stream.throughput / unary.throughput for stream, unary in pairs]
    cpu = [stream.cpu_ms / unary.cpu_ms for stream, unary in pairs if stream.cpu_ms and unary.cpu_ms]
    cpu_text = f", {_rounds(cpu)} the CPU per request" if cpu else ""
    print(f"  {model} gRPC stream vs unary at {concurrency} clients: {_rounds(throughput)} the req/s{cpu_text}")


def _cpu_target(
    label: str, floor_name: str, pairs: list[tuple[Result, Result]], most_ratio: float, most_ms: float | None
) -> None:
    measured = [(gateway.cpu_ms, floor.cpu_ms) for gateway, floor in pairs if gateway.cpu_ms and floor.cpu_ms]
    if not measured:
        return
    spent = statistics.median(gateway for gateway, _ in measured)
    floors = statistics.median(floor for _, floor in measured)
    ratios = [gateway / floor for gateway, floor in measured]
    held = statistics.median(ratios) <= most_ratio and (most_ms is None or spent <= most_ms)
    limit = f"<= {most_ratio}x" if most_ms is None else f"<= {most_ms:.2f} ms and <= {most_ratio}x"
    print(f"  {label}: gateway {spent:.3f} ms CPU/request (floor {floors:.3f} ms, medians), {_rounds(ratios)} the "
          f"{floor_name}'s (target {limit}) {'ok' if held else 'MISSED'}")


def print_triton_report(results: list[Result], cpu: dict[tuple[str, str, int], Usage]) -> None:
    """bench_triton.py: the gateway vs direct Triton, and both vs a bare Python gRPC hop (the floor)."""

    def get(model: str, mode: str, concurrency: int) -> Result:
        return next(r for r in results if (r.model, r.mode, r.concurrency) == (model, mode, concurrency))

    print(f"\n{'model':<11} {'mode':<19} {'conc':>4} {'req/s':>8} {'p50 ms':>8} {'p99 ms':>8}   CPU ms/req: "
          f"{'hop':>5} {'triton':>6} {'client':>6}")
    for r in results:
        p50, p99 = r.percentile(50), r.percentile(99)
        hop, server, client = cpu[(r.model, r.mode, r.concurrency)]
        print(f"{r.model:<11} {r.mode:<19} {r.concurrency:>4} {r.throughput:>8.0f} {p50:>8.2f} {p99:>8.2f}"
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
    _print_triton_streams(results, cpu)


def _print_triton_streams(results: list[Result], cpu: dict[tuple[str, str, int], Usage]) -> None:
    """The gateway's stream (Triton backend) against Triton's own streaming front end, and against its unary calls,
    for the model and client count that ran on streams."""
    for r in results:
        if r.mode != "gateway-grpc-stream":
            continue
        runs = {m.mode: m for m in results if (m.model, m.concurrency) == (r.model, r.concurrency)}
        direct, unary = runs["triton-grpc-stream"], runs["gateway-grpc"]
        hop, unary_hop = cpu[(r.model, r.mode, r.concurrency)][0], cpu[(r.model, "gateway-grpc", r.concurrency)][0]
        print(f"gRPC streams ({r.model}, {r.concurrency} clients, one stream each): the gateway's "
              f"{r.throughput:.0f} req/s, {r.throughput / direct.throughput:.2f}x Triton's own stream "
              f"({direct.throughput:.0f} req/s), p50 {r.percentile(50):.2f} vs {direct.percentile(50):.2f} ms; "
              f"vs the gateway's unary calls {r.throughput / unary.throughput:.2f}x the req/s, its own CPU "
              f"{hop:.2f} vs {unary_hop:.2f} ms per request")
