"""Gateway settings, read from ``SWITCHYARD_*`` environment variables (CLI flags override them)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

MAX_PORT = 65535


class Settings(BaseSettings):
    # The docstring under each field is its description: `switchyard settings` and docs/settings.md list them.
    model_config = SettingsConfigDict(env_prefix="SWITCHYARD_", frozen=True, use_attribute_docstrings=True)

    repository: Path = Path("model_repository")
    """Model repository to serve: any Triton model repository (the exporter's manifests are optional)."""
    backend: Literal["embedded", "triton"] = "embedded"
    """``embedded``: onnxruntime / TorchScript in this process; ``triton``: forward to a Triton server."""
    triton_url: str = "127.0.0.1:8101"
    """Triton's gRPC endpoint (host:port) when ``backend`` is ``triton``."""
    triton_http_url: str = ""
    """Triton's HTTP endpoint (host:port): when set, inference calls go there (binary tensors on kept-alive
    connections: a fraction of a gRPC call's CPU in the gateway); health, model control and statistics stay on
    gRPC. Empty: inference over gRPC too."""
    triton_control_timeout_s: float = 5.0
    """Client timeout of Triton health, repository-index and configuration calls."""
    triton_infer_timeout_s: float = 60.0
    """Client timeout of an inference sent to Triton without a deadline of its own."""
    triton_load_timeout_s: float = 120.0
    """How long loading or unloading versions in Triton may take until they have settled."""
    triton_probe_interval_s: float = 0.5
    """Period of the health probe that tracks Triton's liveness and version states."""
    triton_reload_interval_s: float = 5.0
    """Least time between two attempts to load versions a restarted Triton no longer serves."""
    triton_breaker_failures: int = 3
    """Consecutive connection failures that open the circuit breaker in front of Triton."""
    triton_breaker_reset_s: float = 1.0
    """How long the breaker stays open (requests fail fast with 503) before a trial request."""
    triton_reconnect_backoff_s: float = 0.5
    """Longest wait between two gRPC reconnection attempts while Triton is gone."""
    triton_max_inflight: int = 4096
    """Requests in flight to Triton at most; beyond it requests are refused with 503."""
    triton_shared_memory: bool = False
    """Triton runs on this host and sees its /dev/shm: shared-memory regions clients register are registered in
    Triton too and requests name them, so tensors skip the gRPC hop. False: the gateway copies tensors between the
    regions and its requests to Triton."""
    admin_token: SecretStr | None = None
    """Bearer token of the admin API (``/admin``, ``switchyard models``), an operator's; the keys file's
    ``[admins.<id>]`` tokens (read-only or operator) work beside it. Neither: the admin API is off."""
    repository_api_open: bool = False
    """Let anyone call the model-repository extension (``/v2/repository/...``, gRPC ``Repository*``: index, load,
    unload) without the admin token. False: those calls need ``Authorization: Bearer <SWITCHYARD_ADMIN_TOKEN>``."""
    state_path: Path | None = None
    """Routing state file (its audit log lies beside it); default: under ``$XDG_STATE_HOME/switchyard``, named
    after the repository, never inside it. One gateway per file."""
    redis_url: str | None = None
    """Share routing, the audit log and action locks with other gateway replicas through Redis
    (``redis://host:6379/0``); unset: a state file, one gateway."""
    redis_prefix: str = "switchyard"
    """Key prefix in Redis: replicas serving the same models share it; other deployments pick their own."""
    redis_lock_ttl_s: float = 15.0
    """Expiry of a model's action lock in Redis (renewed while the action runs): how long a crashed replica's
    lock blocks the others."""
    repository_poll_s: float = 10.0
    """Period of the repository rescan (new models load and route; new versions are only listed); 0: off."""
    drain_timeout_s: float = 30.0
    """How long a swap or unload waits for the requests in flight on the version it replaces."""
    max_drain_timeout_s: float = 600.0
    """Largest ``drain_timeout_s`` an admin call may ask for."""
    shadow_max_pending: int = 32
    """Shadow requests in flight at most; beyond it new ones are dropped (counted), never queued."""
    warmup_timeout_s: float = 60.0
    """How long one warm-up (or comparison) request of a version being loaded may take."""
    host: str = "127.0.0.1"
    """Interface the HTTP and gRPC listeners bind."""
    port: int = 8000
    """HTTP port (KServe v2 REST, /metrics), 0 to 65535; 0 picks a free one."""
    grpc_port: int | None = 8001
    """gRPC port (KServe v2 GRPCInferenceService), 0 to 65535 and not the HTTP port; 0 picks a free one, ``off``
    serves no gRPC."""
    workers: int = 1
    """Worker processes serving the same HTTP and gRPC ports (``SO_REUSEPORT``), one event loop each; 0: one per
    core the process may use (its CPU affinity, within a container's CPU limit). They share one routing state
    (worker 0 runs the version actions), one set of figures (``/metrics``, the statistics extension, readiness
    answer for the node) and the rate limits and concurrency caps."""
    worker_hang_timeout_s: float = 30.0
    """With ``workers`` above 1 (or 0): a worker whose event loop gave no sign of life for this long is killed and
    started again (it would hold its share of the node's new connections, unanswered). A model load that holds the
    loop on purpose is allowed up to 900 s. 0: never."""
    intra_op_threads: int | None = None
    """Threads per model instance for onnxruntime / libtorch; None: the process's share of the cores (CPU count /
    workers) / instance count."""
    gpu_fallback: Literal["none", "cpu"] = "none"
    """Embedded backend: what a ``KIND_GPU`` instance group does on a process without a usable GPU. ``none``: the
    model is unavailable with the reason (never silently on the CPU); ``cpu``: it runs on the CPU, with a warning
    and ``fallback="cpu"`` on ``switchyard_model_instances``."""
    intra_op_spinning: bool = False
    """Let onnxruntime's idle threads spin: lower latency, but they compete with the event loop for CPU."""
    batch_adaptive_delay: bool = True
    """Spend a model's ``max_queue_delay_microseconds`` only while recent batches were bigger than the one being
    formed, and only when the model's measured runs show a bigger batch costs less per row; when they show it does
    not (and the runs go to worker threads), form each instance's next batch while its current one runs (False:
    always wait for company, and form a batch only for a free instance, exactly as Triton does)."""
    inline_batch_us: float = 200.0
    """Embedded backend: run a batch on the event loop's thread when it is expected to take less than this many
    microseconds (a tiny model), instead of handing it to the version's worker threads (0: always hand it over)."""
    max_body_bytes: int = 64 * 1024 * 1024
    """Largest inference request body accepted, checked while it streams in (HTTP 413 / gRPC
    RESOURCE_EXHAUSTED above it)."""
    shared_memory: bool = False
    """Serve the system shared-memory extension (``/v2/systemsharedmemory``, gRPC ``SystemSharedMemory*``) to
    clients on this host: they register POSIX shm objects under /dev/shm, which the gateway opens read-write. Off by
    default, as in Triton (``--allow-client-shm``): any client that can reach the gateway could name any shm object of
    the gateway's user. Off: status lists nothing, unregister does nothing, register is refused."""
    shared_memory_max_regions: int = 256
    """Shared-memory regions registered at most (all tenants together); each holds a file descriptor."""
    shared_memory_max_bytes: int = 4 * 1024**3
    """Bytes of shared memory registered at most (the regions' byte sizes, all tenants together)."""
    api_keys: SecretStr | None = None
    """Comma-separated ``key[:tenant]`` entries; set (or ``api_keys_file`` set): inference needs an API key
    (``X-API-Key`` header, ``x-api-key`` gRPC metadata). Unset: open. A key without a tenant is its own tenant,
    ``key-`` and the first 8 hex digits of the key's SHA-256."""
    api_keys_file: Path | None = None
    """A file of ``key[:tenant]`` lines (``#`` comments), or when it ends in ``.toml`` / ``.yaml`` / ``.yml`` one
    ``[keys.<id>]`` table per key (hashed secrets, the models it may call, an expiry, its own rps / burst /
    concurrency) and one ``[admins.<id>]`` table per admin token (read-only or operator); ``switchyard keys``
    writes it. Re-read when it changes; adds to ``api_keys``."""
    protect_metadata: bool = False
    """Also require the API key on model metadata, readiness and configuration (health and /metrics stay open)."""
    rate_limit_rps: float = 0.0
    """Sustained requests per second each API key (tenant) may send; anonymous clients share one bucket.
    0: no rate limit."""
    rate_limit_burst: int = 0
    """Requests a key may send at once above its rate (the bucket's size); 0: one second's worth."""
    limits_file: Path | None = None
    """TOML file of per-tenant and per-model rate-limit overrides (docs/request-shaping.md)."""
    max_concurrency: int = 64
    """Requests one model executes at once (all versions together); more wait in its queue. 0: no cap."""
    max_queue: int = 256
    """Requests that may wait for a model's concurrency slot; beyond it the lowest priority is refused at once
    with 503 and ``Retry-After``."""
    adaptive_concurrency: bool = False
    """Lower a model's concurrency cap while its latency grows above the unloaded latency (and raise it back
    while it does not), between 1 and ``max_concurrency``: the cap the backend sustains, found at run time."""
    default_timeout_ms: float = 60_000.0
    """Deadline of a request that names none (``timeout`` parameter, ``X-Request-Timeout``, gRPC deadline);
    0: none."""
    max_timeout_ms: float = 300_000.0
    """Longest deadline a request may ask for; longer ones are cut to it."""
    priority_levels: int = 3
    """Priorities a request may name (1 highest … ``priority_levels`` lowest; 0 or none: ``default_priority``)."""
    default_priority: int = 2
    """Priority of a request that names none."""
    embedded_max_queue: int = 1024
    """Requests the embedded batcher of one version queues when its ``config.pbtxt`` sets no
    ``max_queue_size``; beyond it the lowest priority is refused (503)."""
    header_timeout_s: float = 10.0
    """Time a client has, from connecting (or from the first byte of its next request on a kept-alive connection),
    to send a request's complete headers; the idle time between requests is ``keep_alive_s``'s."""
    body_timeout_s: float = 60.0
    """Time a client has to send a request's whole body once its headers arrived."""
    keep_alive_s: float = 75.0
    """How long an idle keep-alive HTTP connection stays open; clients should drop idle connections sooner
    (e.g. httpx ``keepalive_expiry`` below this) so they never reuse one the gateway is closing."""
    max_connections: int = 4096
    """Open HTTP connections at most; beyond it new connections are closed at once (keep it below the
    process's file-descriptor limit)."""
    max_header_bytes: int = 64 * 1024
    """Largest request head a client may send before anything checks who it is (HTTP: request line and headers;
    gRPC: a call's metadata), counted while it arrives: beyond it HTTP answers 431 and closes the connection, gRPC
    refuses the call (its ``grpc.max_metadata_size``)."""
    max_header_line_bytes: int = 16 * 1024
    """Longest HTTP request line or header line (name and value); beyond it: 431, connection closed."""
    max_header_count: int = 100
    """Most header lines an HTTP request may have; beyond them: 431, connection closed."""
    grpc_shutdown_grace_s: float = 5.0
    """How long gRPC calls in flight may finish when the gateway stops."""
    grpc_health_interval_s: float = 0.5
    """How often an open ``grpc.health.v1.Health/Watch`` stream re-reads readiness to send a change."""
    grpc_health_max_watches: int = 100
    """Open ``grpc.health.v1.Health/Watch`` streams at most; more are refused (RESOURCE_EXHAUSTED)."""
    stream_max_inflight: int = 64
    """Requests of one stream (gRPC ``ModelStreamInfer``) being served at once; past it the gateway stops reading the
    stream until one is answered (backpressure through gRPC flow control, never an unbounded queue)."""
    stream_idle_timeout_s: float = 300.0
    """A stream with no request in flight and none arriving for this long is ended (gRPC ``DEADLINE_EXCEEDED``
    saying so); 0: never."""
    stream_max_open: int = 1024
    """``ModelStreamInfer`` streams open at once in a gateway process (each holds ~20-40 KiB while open, idle or
    not); more are refused (``RESOURCE_EXHAUSTED``) until one ends. gRPC caps streams per connection, not
    connections: without this a client opening many would grow the gateway's memory without bound."""
    trace_detail: Literal["stages", "request"] = "stages"
    """With tracing on (the standard ``OTEL_*`` variables name an exporter or an OTLP endpoint): ``stages`` records a
    request's server span and a child per stage (admission wait, batch queue, execution, the call to Triton);
    ``request`` only the server span."""
    inference_log: str = ""
    """Where to log what models were asked and answered: ``file:///abs/dir`` (rotating JSON-lines files),
    ``redis://host:port/db?stream=NAME[&maxlen=N]`` (a Redis stream), ``http(s)://...`` (CloudEvents in binary mode
    with KServe's event types); empty: off."""
    inference_log_sample: float = 1.0
    """Share of requests logged, 0 to 1 (a model's own share, set through the admin API, overrides it)."""
    inference_log_queue: int = 4096
    """Requests waiting for the log's writer at most; past it records are dropped and counted, never waited for."""
    inference_log_max_record_bytes: int = 65536
    """A record's size cap: the largest tensors lose their values (the record says ``truncated``) to fit."""
    inference_log_file_max_bytes: int = 64 * 2**20
    """A JSON-lines log file's size before the next one is started."""
    inference_log_file_count: int = 16
    """JSON-lines log files kept; the oldest are deleted past it."""
    inference_log_timeout_s: float = 5.0
    """How long one write to a Redis or HTTP sink may take before its records are dropped (and counted)."""
    tls_cert_file: Path | None = None
    """PEM certificate chain the HTTP and gRPC listeners present (with ``tls_key_file``; both or neither). Unset:
    plain HTTP and gRPC. Replaced on disk, it is loaded again within a second: new connections get it, open ones
    keep the old one."""
    tls_key_file: Path | None = None
    """PEM private key of ``tls_cert_file``."""
    tls_client_ca_file: Path | None = None
    """PEM CA certificates that sign the clients' certificates (mutual TLS); needs ``tls_cert_file``."""
    tls_client_auth: Literal["none", "optional", "required"] | None = None
    """Client certificates with ``tls_client_ca_file``: ``required`` (the default when the CA file is set: a client
    without a certificate signed by it is refused), ``optional`` (HTTP checks a certificate a client sends; gRPC does
    not ask for one), ``none`` (not asked)."""
    triton_tls: bool = False
    """Reach Triton's gRPC endpoint over TLS (Triton's ``--grpc-use-ssl``). Triton's HTTP front end has no TLS, so
    ``triton_http_url`` must stay empty then."""
    triton_tls_ca_file: Path | None = None
    """PEM CA certificates Triton's certificate is checked against; unset: the system's roots."""
    triton_tls_cert_file: Path | None = None
    """PEM client certificate the gateway presents to Triton (Triton's ``--grpc-use-ssl-mutual``), with
    ``triton_tls_key_file``."""
    triton_tls_key_file: Path | None = None
    """PEM private key of ``triton_tls_cert_file``."""
    model_cache_mb: float | None = None
    """Memory budget of the loaded models, in MiB: set, the gateway loads a model's routed version on its first
    request and unloads the least recently used models with no request in flight to stay within it
    (docs/model-cache.md). Unset: every model is loaded at start and stays loaded."""
    pinned_models: str = ""
    """Comma-separated models the model cache loads at start and never unloads."""
    model_min_residency_s: float = 0.0
    """With the model cache, a model loaded less than this long ago is not unloaded to make room: a load that needs
    its room waits (fewer reloads when traffic cycles through more models than fit, at the cost of miss latency).
    0: the least recently used model goes as soon as it has served the requests it was loaded for."""
    model_idle_unload_s: float = 0.0
    """With the model cache, unload a model no request used for this long, budget or not; 0: only to make room."""
    log_level: str = "info"
    """Log level for the gateway and uvicorn."""
    access_log: bool = False
    """uvicorn's per-request access log (off by default: it costs throughput)."""
    gc_freeze: bool = True
    """Move everything alive after startup (framework, clients, models: ~200k objects) out of the cyclic
    garbage collector's reach: otherwise its full collections re-scan them all while requests wait."""

    @model_validator(mode="after")
    def _limits_make_sense(self) -> Settings:
        """Refuse at startup what would misbehave later, naming the variable and the range."""
        counts = {
            "max_body_bytes": self.max_body_bytes, "max_concurrency": self.max_concurrency,
            "max_queue": self.max_queue, "embedded_max_queue": self.embedded_max_queue,
            "rate_limit_burst": self.rate_limit_burst, "shared_memory_max_regions": self.shared_memory_max_regions,
            "shared_memory_max_bytes": self.shared_memory_max_bytes, "workers": self.workers,
        }
        schemes = ("file", "redis", "rediss", "http", "https")
        if self.inference_log and self.inference_log.split("://", 1)[0] not in schemes:
            from services.inferlog.sources import shown  # only on this error: a mistyped scheme keeps its password

            raise ValueError(
                f"SWITCHYARD_INFERENCE_LOG must be file:///abs/dir, redis://host:port/db?stream=NAME or an http(s):// "
                f"URL, got {shown(self.inference_log)!r}"
            )
        if not 0.0 <= self.inference_log_sample <= 1.0:
            sample = self.inference_log_sample
            raise ValueError(f"SWITCHYARD_INFERENCE_LOG_SAMPLE must lie between 0 and 1, got {sample}")
        logged = {
            "inference_log_queue": self.inference_log_queue,
            "inference_log_max_record_bytes": self.inference_log_max_record_bytes,
            "inference_log_file_max_bytes": self.inference_log_file_max_bytes,
            "inference_log_file_count": self.inference_log_file_count,
        }
        for name, value in logged.items():
            if value < 1:
                raise ValueError(f"SWITCHYARD_{name.upper()} must be at least 1, got {value}")
        for name, value in counts.items():
            if value < 0:
                raise ValueError(f"SWITCHYARD_{name.upper()} must be 0 or more, got {value}")
        seconds = {
            "rate_limit_rps": self.rate_limit_rps, "default_timeout_ms": self.default_timeout_ms,
            "max_timeout_ms": self.max_timeout_ms, "header_timeout_s": self.header_timeout_s,
            "body_timeout_s": self.body_timeout_s, "keep_alive_s": self.keep_alive_s,
            "inline_batch_us": self.inline_batch_us, "stream_idle_timeout_s": self.stream_idle_timeout_s,
        }
        for name, number in seconds.items():
            if not number >= 0:  # NaN too
                raise ValueError(f"SWITCHYARD_{name.upper()} must be 0 or more, got {number}")
        hang = self.worker_hang_timeout_s
        if not (hang == 0 or hang >= 2):  # NaN too; a worker's loop beats every second
            raise ValueError(f"SWITCHYARD_WORKER_HANG_TIMEOUT_S must be 0 (no watchdog) or at least 2 (a worker beats "
                             f"every second), got {hang}")
        if self.triton_http_url and not _host_port(self.triton_http_url):
            raise ValueError(f"SWITCHYARD_TRITON_HTTP_URL must be host:port, got {self.triton_http_url!r}")
        positive = {
            "max_connections": self.max_connections, "max_header_bytes": self.max_header_bytes,
            "max_header_line_bytes": self.max_header_line_bytes, "max_header_count": self.max_header_count,
            "grpc_health_max_watches": self.grpc_health_max_watches, "stream_max_inflight": self.stream_max_inflight,
            "stream_max_open": self.stream_max_open,
        }
        for name, value in positive.items():
            if value < 1:
                raise ValueError(f"SWITCHYARD_{name.upper()} must be at least 1, got {value}")
        if not self.grpc_health_interval_s > 0:  # NaN too; 0 would poll without pause
            interval = self.grpc_health_interval_s
            raise ValueError(f"SWITCHYARD_GRPC_HEALTH_INTERVAL_S must be more than 0, got {interval}")
        if self.model_cache_mb is not None and not self.model_cache_mb > 0:  # NaN too
            raise ValueError(f"SWITCHYARD_MODEL_CACHE_MB must be more than 0 (MiB), got {self.model_cache_mb}")
        for name in ("model_min_residency_s", "model_idle_unload_s"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"SWITCHYARD_{name.upper()} must be 0 or more, got {getattr(self, name)}")
        if self.pinned_models.strip() and self.model_cache_mb is None:
            raise ValueError("SWITCHYARD_PINNED_MODELS needs SWITCHYARD_MODEL_CACHE_MB: without a model cache every "
                             "model stays loaded anyway")
        if not 1 <= self.priority_levels <= 100:
            raise ValueError(f"SWITCHYARD_PRIORITY_LEVELS must lie between 1 and 100, got {self.priority_levels}")
        if not 1 <= self.default_priority <= self.priority_levels:
            raise ValueError(
                f"SWITCHYARD_DEFAULT_PRIORITY must lie between 1 and SWITCHYARD_PRIORITY_LEVELS "
                f"({self.priority_levels}), got {self.default_priority}"
            )
        return self

    @model_validator(mode="after")
    def _ports_are_ports(self) -> Settings:
        """The listeners take any int and wrap it (70000 listens on 4464) or fail deep in the resolver (a negative
        one): refuse both here, naming the variable; 0 asks the kernel for a free port, as documented."""
        for name in ("port", "grpc_port"):
            value = getattr(self, name)
            if value is not None and not 0 <= value <= MAX_PORT:
                raise ValueError(
                    f"SWITCHYARD_{name.upper()} must lie between 0 and {MAX_PORT} (0: a free port), got {value}"
                )
        if self.grpc_port is not None and self.grpc_port == self.port != 0:
            raise ValueError(f"SWITCHYARD_PORT and SWITCHYARD_GRPC_PORT are both {self.port}: HTTP and gRPC each need "
                             "a port of their own")
        return self

    @field_validator("grpc_port", mode="before")
    @classmethod
    def _grpc_off(cls, value: object) -> object:
        """``off`` (or ``none``) as the environment or ``--grpc-port`` spell "no gRPC listener"."""
        if isinstance(value, str) and value.strip().lower() in ("off", "none"):
            return None
        return value

    @model_validator(mode="after")
    def _tls_settings_fit_together(self) -> Settings:
        """Refuse TLS settings that would silently do less than they say; the files are read at startup
        (``security/tls.py``), where a missing or mismatched one is refused naming the variable and the file."""
        pairs = [("tls_cert_file", "tls_key_file"), ("triton_tls_cert_file", "triton_tls_key_file")]
        for first, second in pairs:
            if (getattr(self, first) is None) != (getattr(self, second) is None):
                raise ValueError(f"SWITCHYARD_{first.upper()} and SWITCHYARD_{second.upper()} go together: set both "
                                 "or neither")
        if self.tls_client_ca_file is not None and self.tls_cert_file is None:
            raise ValueError("SWITCHYARD_TLS_CLIENT_CA_FILE needs SWITCHYARD_TLS_CERT_FILE and SWITCHYARD_TLS_KEY_FILE "
                             "(client certificates are checked only on TLS listeners)")
        if self.tls_client_auth in ("optional", "required") and self.tls_client_ca_file is None:
            raise ValueError(f"SWITCHYARD_TLS_CLIENT_AUTH={self.tls_client_auth} needs SWITCHYARD_TLS_CLIENT_CA_FILE, "
                             "the CA that signs the clients' certificates")
        triton_files = [self.triton_tls_ca_file, self.triton_tls_cert_file, self.triton_tls_key_file]
        if not self.triton_tls and any(path is not None for path in triton_files):
            raise ValueError("SWITCHYARD_TRITON_TLS_* files are set but SWITCHYARD_TRITON_TLS is false: set it to "
                             "true to reach Triton over TLS")
        if self.triton_tls and self.triton_http_url:
            raise ValueError("SWITCHYARD_TRITON_TLS needs SWITCHYARD_TRITON_HTTP_URL empty: Triton's HTTP front end "
                             "has no TLS, so inference must go over gRPC")
        return self


def pinned(settings: Settings) -> frozenset[str]:
    """``pinned_models`` as names."""
    return frozenset(name.strip() for name in settings.pinned_models.split(",") if name.strip())


def _host_port(address: str) -> bool:
    host, _, port = address.rpartition(":")
    return bool(host) and port.isascii() and port.isdigit() and 0 < int(port) <= MAX_PORT
