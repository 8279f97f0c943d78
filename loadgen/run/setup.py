"""A run's client set-up, the same in every engine process: headers, secrets, adapter, engine.

Read once by the parent (`run.host`) and again by each worker (`run.scale.workers`) from the
same spec and options, so every process sends the same requests the same way.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

from loadgen.adapters import adapter_for
from loadgen.adapters.protocol import Adapter, BodyOptions
from loadgen.engine.runner import EngineConfig
from loadgen.engine.secrets import Redactor, run_secrets
from loadgen.engine.transport import Endpoint, make_endpoint
from loadgen.errors import ConfigError
from loadgen.run.options import RunOptions
from loadgen.workload.prompts import PromptMaker
from loadgen.workload.spec import ENV_REFERENCE as ENV_REF
from loadgen.workload.spec import WorkloadSpec, header_problem


def resolve_headers(
    spec: WorkloadSpec, extra: Mapping[str, str], env_values: list[str] | None = None
) -> dict[str, str]:
    """Request headers: the API's, the file's (with `${VAR}` from the environment), extras.

    Every value read from the environment is appended to `env_values` (they are secrets).
    """
    source = spec.source
    env_values = env_values if env_values is not None else []
    own = {k: v for k, v in spec.target.headers.items() if k not in extra}
    headers = {
        **_expanded(source, "target.headers", own, env_values),
        **_expanded(source, "", extra, env_values, flag="--header"),
    }
    key_env, key = spec.target.api_key_env, None
    if key_env:
        key = os.environ.get(key_env)
        if not key:
            raise ConfigError(
                source,
                "target.api_key_env",
                f"environment variable {key_env} is not set",
                f"export {key_env}=<your key> before the run",
            )
        env_values.append(key)
    # The API's own headers and the key where it expects it (Bearer; Anthropic: x-api-key).
    resolved = {**adapter_for(spec.target.api, spec.target.generic).headers(key), **headers}
    for name, value in resolved.items():  # a value read from the environment: CR/LF, ...
        if problem := header_problem(name, value):
            problem = problem.replace("a header value", "its value")
            fix = "check the environment variable it is read from"
            if name in extra:
                raise ConfigError(_flag_text("--header", name, extra[name]), "", problem, fix)
            raise ConfigError(source, f"header {name}", problem, fix)
    return resolved


def _flag_text(flag: str, name: str, value: str) -> str:
    """How the user wrote a header flag: `--header 'Authorization: ${KEY}'`."""
    return f"{flag} {f'{name}: {value}'!r:.120}"


def _expanded(
    source: str, key: str, given: Mapping[str, str], env_values: list[str],
    flag: str | None = None,
) -> dict[str, str]:  # fmt: skip
    """`given` with each `${VAR}` read from the environment (each value read appended to
    `env_values`); an unset one is a ConfigError at `key.NAME` of the file, or, for headers
    given by `flag` on the command line, at that flag as written."""
    headers: dict[str, str] = {}
    for name, value in given.items():

        def expand(match: re.Match[str], name: str = name, value: str = value) -> str:
            var = match.group(1)
            if var not in os.environ:
                if flag is not None:
                    raise ConfigError(
                        _flag_text(flag, name, value), "", f"{var} is not set",
                        f"export {var}=... before the run, or give the value itself",
                    )  # fmt: skip
                raise ConfigError(
                    source, f"{key}.{name}", f"${{{var}}} is not set",
                    f"export {var}=... before the run",
                )  # fmt: skip
            env_values.append(os.environ[var])
            return os.environ[var]

        headers[name] = ENV_REF.sub(expand, value)
    return headers


def metrics_headers(
    spec: WorkloadSpec, options: RunOptions, env_values: list[str] | None = None
) -> dict[str, str]:
    """The metrics endpoint's own headers: the file's `target.server_metrics_headers`, then
    `--server-metrics-header`s, `${VAR}` read from the environment."""
    extra = options.server_metrics_headers
    own = {k: v for k, v in spec.target.server_metrics_headers.items() if k not in extra}
    values = env_values if env_values is not None else []
    flag = "--server-metrics-header"
    headers = {
        **_expanded(spec.source, "target.server_metrics_headers", own, values),
        **_expanded(spec.source, "", extra, values, flag=flag),
    }
    for name, value in headers.items():  # a value read from the environment: CR/LF, ...
        if problem := header_problem(name, value):
            problem = problem.replace("a header value", "its value")
            fix = "check the environment variable it is read from"
            if name in extra:
                raise ConfigError(_flag_text(flag, name, extra[name]), "", problem, fix)
            raise ConfigError(spec.source, f"server metrics header {name}", problem, fix)
    return headers


def metrics_url(spec: WorkloadSpec, options: RunOptions) -> str | None:
    """The URL scraped, as given (a path is on the target's origin), or None: no scraping."""
    return options.server_metrics_url or spec.target.server_metrics_url


def client_setup(
    spec: WorkloadSpec, options: RunOptions
) -> tuple[Adapter, dict[str, str], Redactor, str | None]:
    """The adapter, the request headers, the redactor of their secrets, and the URL.

    The redactor knows the metrics endpoint's secrets too (every value of its own headers,
    its URL's user-info and query): a log line or error of any process hides them.
    """
    adapter = adapter_for(spec.target.api, spec.target.generic)
    check_priority(spec, adapter)
    env_values: list[str] = []
    headers = resolve_headers(spec, options.extra_headers, env_values)
    url = options.url or spec.target.url
    secrets = run_secrets(headers, env_values, url, spec.target.path)
    for proxy_url in options.network.proxies.urls():  # a proxy's user-info is a credential
        secrets += run_secrets({}, (), proxy_url)
    scraped = metrics_url(spec, options)
    if scraped is not None:
        own = metrics_headers(spec, options, secrets)
        secrets += [*own.values(), *run_secrets({}, (), scraped)]
    return adapter, headers, Redactor(secrets), url


def check_priority(spec: WorkloadSpec, adapter: Adapter) -> None:
    """A class's `priority` must reach the server: in the body, where the API has a field
    for it (the adapter's `priority_field`), else as `target.priority_header`."""
    if adapter.priority_field is not None or spec.target.priority_header is not None:
        return
    for name, cls in spec.classes.items():
        if cls.priority is not None:
            raise ConfigError(
                spec.source, f"classes.{name}.priority",
                f"{adapter.name} requests have no body field for a priority",
                "name a header for it with target.priority_header, or remove it",
            )  # fmt: skip


def engine_setup(
    spec: WorkloadSpec,
    options: RunOptions,
    base_url: str,
    adapter: Adapter,
    headers: Mapping[str, str],
    redactor: Redactor,
) -> tuple[Endpoint, EngineConfig]:
    """The endpoint and the engine's configuration (the same in every worker process).

    The endpoint carries the run's TLS settings and the proxy on the way to `base_url`; the
    built-in simulator (no URL given) is on loopback and never behind a proxy.
    `target.accept_encoding` is sent as the request's Accept-Encoding (replacing one given
    as a header): the transport inflates what it asked for."""
    network = options.network
    builtin = (options.url or spec.target.url) is None
    proxy = None if builtin else network.proxy_for(base_url)
    headers = dict(headers)
    if spec.target.accept_encoding:
        headers = {k: v for k, v in headers.items() if k.lower() != "accept-encoding"}
        headers["Accept-Encoding"] = ", ".join(spec.target.accept_encoding)
    endpoint = make_endpoint(base_url, spec.target.path or adapter.default_path, headers,
                             tls=network.tls, proxy=proxy)  # fmt: skip
    body_options = BodyOptions(
        model=spec.target.model,
        include_usage=spec.target.include_usage,
        force_output_tokens=spec.target.force_output_tokens,
        extra_body=spec.target.extra_body,
    )
    seed = spec.seed if options.seed is None else options.seed
    config = EngineConfig(
        adapter=adapter,
        body_options=body_options,
        seed=seed,
        max_in_flight=options.max_in_flight,
        priority_header=spec.target.priority_header,
        prompts=PromptMaker(seed, spec.target.tokenizer, options.nonce),
        redactor=redactor,
        max_event_bytes={name: c.limits.max_event_bytes for name, c in spec.classes.items()},
        request_id_header=spec.target.request_id_header,
        request_id_format=spec.target.request_id_format,
        allow_early_stops=spec.target.allow_early_stops,
        request_id_body=spec.target.request_id_body,
        traceparent=spec.target.traceparent,
        tracestate=spec.target.tracestate,
    )
    return endpoint, config
