"""Secrets of the live processes, read once when a process starts, before anything runs: the
queue's URL and Redis password, TLS files, and the API keys. This is the one place that reads
the environment and secret files; the fleet file only says where they are.

API keys come from three sources, merged: `api.keys` inline (demos), `api.keys_file` (a YAML
file, e.g. a mounted Kubernetes Secret) and the environment variable named by `api.keys_env`
(default QLM_API_KEYS, e.g. filled from a Secret with secretKeyRef). Each holds YAML mapping a
tenant to a key or a list of keys (several keys per tenant allow rotation):

    team-a: sk-a1b2c3...
    team-b: [sk-old..., sk-new...]

Errors are ConfigErrors naming the setting and the file (with line) or the variable; they
never repeat a secret (YAML parse errors are reduced to their line, since the parser quotes
the text around them).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import SecretStr, ValidationError

from qlm.config import ConfigError
from qlm.config.api_settings import ApiConfig, ApiKey
from qlm.config.serve_config import QueueConfig, ServeConfig

Environ = Mapping[str, str]
_REDIS_SCHEMES = ("redis", "rediss", "unix", "redis+sentinel")


def queue_url(settings: QueueConfig, environ: Environ) -> str | None:
    """The queue URL: from the variable `url_env` names when it is set, else `url`; None is
    the in-memory queue. A named variable that is unset, with no `url` to fall back on, is
    an error (an API replica must not silently run on a queue of its own)."""
    if settings.url_env is None:
        return settings.url
    url = environ.get(settings.url_env) or settings.url
    if url is None:
        raise ConfigError(f"queue.url_env: environment variable {settings.url_env} is not set")
    scheme = url.partition("://")[0].lower()
    if scheme not in ("memory", *_REDIS_SCHEMES):
        raise ConfigError(
            f"queue.url_env: the URL in {settings.url_env} must start with memory://, redis://, "
            "rediss://, unix:// or redis+sentinel://"
        )
    return url


def queue_options(config: ServeConfig, url: str | None, environ: Environ) -> dict[str, Any]:
    """make_queue options: the bounds, and for Redis the prefix, credentials and TLS files."""
    q = config.queue
    options: dict[str, Any] = {
        "key_prefix": q.key_prefix,
        "max_queued": q.max_queued,
        "max_queued_per_tenant": q.max_queued_per_tenant,
        "reserved_queued": q.reserved_queued,
        "reserved_classes": config.reserved_classes(),
    }
    if url is None or url.partition("://")[0].lower() not in _REDIS_SCHEMES:
        return options
    password = _queue_password(q, environ)
    if password is not None:
        options["password"] = password
    if q.username is not None:
        options["username"] = q.username
    for name in ("ssl_ca_certs", "ssl_certfile", "ssl_keyfile"):
        path: Path | None = getattr(q, name)
        if path is not None:
            if not path.is_file():
                raise ConfigError(f"queue.{name}: {path} is not a readable file")
            options[name] = str(path)
    options["ssl_cert_reqs"] = q.ssl_cert_reqs
    options["replicas_to_ack"] = q.replicas_to_ack
    options["replica_ack_timeout_s"] = q.replica_ack_timeout_s
    if q.sentinel_password_env is not None:
        options["sentinel_password"] = _required_env(
            environ, q.sentinel_password_env, "queue.sentinel_password_env"
        )
    return options


def _required_env(environ: Environ, name: str, setting: str) -> str:
    value = environ.get(name)
    if not value:
        raise ConfigError(f"{setting}: environment variable {name} is not set")
    return value


def _queue_password(q: QueueConfig, environ: Environ) -> str | None:
    if q.password_env is not None:
        return _required_env(environ, q.password_env, "queue.password_env")
    if q.password_file is not None:
        try:
            return q.password_file.read_text(encoding="utf-8").rstrip("\r\n")
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(
                f"queue.password_file: cannot read {q.password_file}: {exc}"
            ) from None
    return None


def api_keys(settings: ApiConfig, environ: Environ) -> tuple[ApiKey, ...]:
    """Every configured key with its tenant; a key given twice is an error."""
    keys = [*_inline_keys(settings.keys)]
    if settings.keys_file is not None:
        path = settings.keys_file
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"api.keys_file: cannot read {path}: {exc}") from None
        keys += parse_keys(text, str(path))
    if settings.keys_env is not None and environ.get(settings.keys_env):
        keys += parse_keys(environ[settings.keys_env], f"environment variable {settings.keys_env}")
    seen: dict[str, str] = {}
    for key in keys:
        secret = key.key.get_secret_value()
        if secret in seen:
            raise ConfigError(
                f"API keys: one key is given twice (tenants {seen[secret]!r} and {key.tenant!r})"
            )
        seen[secret] = key.tenant
    return tuple(keys)


def _inline_keys(keys: Mapping[str, SecretStr | list[SecretStr]]) -> Iterator[ApiKey]:
    for tenant, value in keys.items():
        for secret in value if isinstance(value, list) else [value]:
            try:
                yield ApiKey(key=secret, tenant=tenant)
            except ValidationError as exc:
                raise ConfigError(f"api.keys.{tenant}: {_reason(exc)}") from None


def parse_keys(text: str, source: str) -> list[ApiKey]:
    """Keys from YAML text mapping tenant -> key or [key, ...]; `source` names it in errors."""
    try:
        root = yaml.compose(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{source}:{mark.line + 1}" if mark is not None else source
        raise ConfigError(f"{where}: invalid YAML") from None
    if root is None:
        return []
    if not isinstance(root, yaml.MappingNode):
        raise ConfigError(f"{source}:{root.start_mark.line + 1}: must map tenants to keys")
    keys: list[ApiKey] = []
    for tenant_node, value_node in root.value:
        tenant = str(tenant_node.value)
        items = value_node.value if isinstance(value_node, yaml.SequenceNode) else [value_node]
        for node in items:
            where = f"{source}:{node.start_mark.line + 1}: tenant {tenant!r}"
            if not isinstance(node, yaml.ScalarNode):
                raise ConfigError(f"{where}: a key must be a string")
            try:
                keys.append(ApiKey(key=node.value, tenant=tenant))
            except ValidationError as exc:
                raise ConfigError(f"{where}: {_reason(exc)}") from None
    return keys


def _reason(exc: ValidationError) -> str:
    """The first error's field and message, without the offending value."""
    err = exc.errors(include_url=False, include_input=False)[0]
    return f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}"
